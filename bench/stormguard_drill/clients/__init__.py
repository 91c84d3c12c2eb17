"""The clients under test: each client kind, and the builders by name."""
