// Sends N events with npm `lumberjack-protocol` (Lumberjack v1 over TLS: one W 1000 per
// connection, then D frames numbered from 1) and waits until the server acked all of them.
// usage: node send_lumberjack_protocol.js HOST PORT CA_FILE N RUN
'use strict'
const fs = require('fs')
const lumberjack = require('lumberjack-protocol')

const [host, port, caFile, count, run] = process.argv.slice(2)
const n = parseInt(count, 10)
const client = lumberjack.client(
  { host, port: parseInt(port, 10), ca: [fs.readFileSync(caFile, 'utf8')] },
  { maxQueueSize: n + 1, reconnect: 200 },
)
let acks = 0
let sawFirstConnect = false
client.on('connect', () => {
  if (sawFirstConnect) {
    console.error('reconnected: the first connection was dropped')
    process.exit(3)
  }
  sawFirstConnect = true
  client._socket.on('ack', () => { acks += 1 })
})
client.on('dropped', (k) => { console.error(`client dropped ${k} events`); process.exit(4) })
// Queued until the TLS connection is up, then written one by one.
for (let i = 0; i < n; i++) {
  client.writeDataFrame({ line: `node-protocol ${i}`, run, n: String(i) })
}
const timer = setInterval(() => {
  const socket = client._socket
  if (socket && socket.lastAck === n) {
    clearInterval(timer)
    console.log(JSON.stringify({ lastAck: socket.lastAck, acks }))
    client.close()
    process.exit(0)
  }
}, 20)
setTimeout(() => {
  const socket = client._socket
  console.error(`timed out; lastAck ${socket && socket.lastAck}, acks ${acks}`)
  process.exit(2)
}, 60000).unref()
