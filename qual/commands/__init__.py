"""qual's commands, one module each (docs/ARCHITECTURE.md §2): every module's `add(sub,
families)` adds its parser(s), each with its handler (`handler(args, extra, families) -> int`)
and its exit statuses' help from qual.exits; qual.cli builds the parser from them and
dispatches."""
