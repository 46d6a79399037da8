"""logjam-importer: subscribe to the devices, put the messages in order, and append them to the `messages` table."""
