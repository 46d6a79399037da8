// Sends N events with npm `lumberjack-client` (Lumberjack v2, each window a W then a C of J
// frames numbered from 1; it never reads acks): half queued before the connection is up
// (one window), half afterwards (one window each). Exits once everything is written.
// usage: node send_lumberjack_client.js HOST PORT N RUN
'use strict'
const LumberjackClient = require('lumberjack-client')

const [host, port, count, run] = process.argv.slice(2)
const n = parseInt(count, 10)
const client = new LumberjackClient({ host, port: parseInt(port, 10) }, false)
const first = Math.floor(n / 2)
for (let i = 0; i < first; i++) {
  client.log({ message: `node-client ${i}`, run, n: i, '@timestamp': '2024-05-01T12:00:00.000Z' })
}
const timer = setInterval(() => {
  if (!client.connected || client.queue.length) return
  clearInterval(timer)
  for (let i = first; i < n; i++) {
    client.log({ message: `node-client ${i}`, run, n: i, '@timestamp': '2024-05-01T12:00:00.000Z' })
  }
  // The client has no close(); end the socket once its writes are flushed.
  client.socket.end(() => {
    console.log(JSON.stringify({ sent: n }))
    process.exit(0)
  })
}, 10)
setTimeout(() => { console.error('timed out'); process.exit(2) }, 60000).unref()
