// Exports N log records with npm `@opentelemetry/exporter-logs-otlp-http` (OTLP/JSON), made by
// the npm SDK's own LoggerProvider under a resource with service.name SERVICE and the older
// deployment.environment ENV. Records i: body "<tag> <i>", attributes {i, tag, big}; the even
// ones carry a time and a span context (hex ids in OTLP/JSON). Prints {"code": 0} on success.
// usage: node send_otlp_json.js URL N TAG SERVICE ENV [gzip]
'use strict'
const api = require('@opentelemetry/api')
const { SeverityNumber } = require('@opentelemetry/api-logs')
const { resourceFromAttributes } = require('@opentelemetry/resources')
const { LoggerProvider } = require('@opentelemetry/sdk-logs')
const { OTLPLogExporter } = require('@opentelemetry/exporter-logs-otlp-http')

const [url, count, tag, service, env, compression] = process.argv.slice(2)
const n = parseInt(count, 10)
const records = []
const capture = { onEmit (r) { records.push(r) }, forceFlush: async () => {}, shutdown: async () => {} }
const provider = new LoggerProvider({
  resource: resourceFromAttributes({ 'service.name': service, 'deployment.environment': env }),
  processors: [capture]
})
const logger = provider.getLogger('tests.otlp.node', '4.5.6')
const spanContext = { traceId: '0af7651916cd43dd8448eb211c80319c', spanId: 'b7ad6b7169203331', traceFlags: 1 }
for (let i = 0; i < n; i++) {
  const record = {
    severityNumber: SeverityNumber.ERROR, severityText: 'ERROR', body: `${tag} ${i}`,
    attributes: { i, tag, big: 2 ** 53 - 1 }
  }
  if (i % 2 === 0) {
    record.timestamp = 1700000000123 + i
    record.context = api.trace.setSpanContext(api.context.active(), spanContext)
  }
  logger.emit(record)
}
const exporter = new OTLPLogExporter({ url, compression: compression === 'gzip' ? 'gzip' : 'none', timeoutMillis: 30000 })
exporter.export(records, (result) => {
  console.log(JSON.stringify({ code: result.code, error: result.error ? String(result.error) : null }))
  exporter.shutdown().then(() => process.exit(result.code === 0 ? 0 : 1))
})
setTimeout(() => { console.error('timed out'); process.exit(2) }, 60000).unref()
