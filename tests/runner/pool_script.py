"""Runs a runner pool until Ctrl-C, as `alight runner` does; the drain test starts it in a
subprocess. Usage: python pool_script.py STORE_URL AGENT_ENTRYPOINT N_RUNNERS DRAIN_TIMEOUT_S"""

from __future__ import annotations

import logging
import sys

from alight.runner import RunnerPool, run_pool_until_interrupted


def main() -> None:
    url, agent, n, drain = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    def ready(pool: RunnerPool) -> None:
        print("READY", flush=True)

    stats = run_pool_until_interrupted(
        agent, url, n_runners=n, drain_timeout_s=drain, instrument=False, on_ready=ready, heartbeat_interval_s=0.5
    )
    print(f"STATS {stats.attempts_succeeded} {stats.attempts_failed} {stats.workers_alive}", flush=True)


if __name__ == "__main__":
    main()
