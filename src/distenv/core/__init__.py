"""The core's resolution: the description and its words (`description`, `fields`, `checked`,
`export`), the resolver and what it reads with (`reading`, `hostlist`, `ports`, `gpus`,
`placement`), and the floor every module raises and prints through (`_error`, `redact`).
Pure: standard library only, no I/O in `resolve()`; see docs/architecture.md. Nothing is
imported here, so that `import distenv` pays only for what it uses."""
