"""The images' HEALTHCHECK: exit 0 when GET /health on this container's own port answers 200.

The port is read the way the server reads it (`Settings`), so STREAMPOOL_PORT or
STREAMPOOL_METRICS_PORT moves the check along with the server. Usage:
`healthcheck.py port` (gateway) or `healthcheck.py metrics_port` (worker).
"""

from __future__ import annotations

import sys
import urllib.request

from shared.config import Settings

TIMEOUT_SECONDS = 5


def main(port_field: str) -> int:
    port = getattr(Settings(), port_field)  # type: ignore[call-arg]  # every field has a default
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=TIMEOUT_SECONDS) as answer:
            return 0 if answer.status == 200 else 1
    except OSError:  # refused, timed out, or an HTTP error status such as 503
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
