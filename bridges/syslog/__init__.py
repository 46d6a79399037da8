"""logjam-bridge syslog: RFC 5424/3164 over TCP, TLS, UDP and RELP."""
