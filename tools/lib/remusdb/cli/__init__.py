"""The command-line tools: one module per command (or per `remusdb`
verb), each ending through runner.run."""
