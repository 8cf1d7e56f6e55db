"""Starting a `strata serve` for the bench scripts in this folder (conversation_ttft.py,
prompt_window_ttft.py): port 0, --quiet, the port read from the server's first stdout line."""
import re
import subprocess
import sys


def start_server(binary, args):
    """Starts `binary serve --port 0 --quiet ARGS`; returns (process, port). Exits with the
    server's first line and stderr when it did not start."""
    proc = subprocess.Popen([binary, "serve", "--port", "0", "--quiet", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    m = re.search(r"http://[^:]+:(\d+)", line)
    if not m:
        proc.kill()
        sys.exit(f"server did not start: {line!r} {proc.stderr.read()}")
    return proc, int(m.group(1))
