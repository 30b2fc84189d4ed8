"""JetStream: connections, stream definitions, and publishing."""
