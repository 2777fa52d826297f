"""Floor 6, the tools: the `callsat` command line, the ordering study, explain and export."""
