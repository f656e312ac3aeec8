"""The services behind the commands other than `alight train`, each called by `alight.cli` in one
call: `export` (`alight trace --export-sft`). The trainer imports nothing from here."""
