"""The services behind the commands other than `alight train`, each called by `alight.cli` in one
call: `serve` (`alight serve`, `alight store`, `alight runner`), `trace` (reading a run),
`export` (`alight trace --export-sft`), `dev` (`alight dev`'s flags: endpoint, model,
temperature) and `evaluation` (`alight eval`). Running tasks through the stack is the trainer's
(`alight.trainer.tasks`, which `Trainer.dev` runs too); the trainer imports nothing from here."""
