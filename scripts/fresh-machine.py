#!/usr/bin/env python3
"""What a newcomer meets on a fresh machine, checked for real.

A clean clone of HEAD, an empty cargo home: the README's first command
(`cargo run --release -- serve`) builds, serves, and answers the README's first request
(grpcurl, `Check`). The time to each step is printed: clone, serve ready, first answer.

(The image is built and run by a container engine in scripts/image-check.sh, in a build
container whose cargo home is empty.)

Usage: scripts/fresh-machine.py [--keep]
Every wait is bounded; the server listens on loopback only and is stopped at the end.
"""

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A clean build on two cores takes 5-6 minutes; far beyond that something is wrong.
BUILD_DEADLINE_S = 1800
FIRST_REQUEST = {"items": [{"name": "NewOrdersPerAccount", "id": "12345678"}]}


def log(message):
    print(f"fresh-machine: {message}", flush=True)


def run(args, **kwargs):
    log("$ " + " ".join(shlex.quote(a) for a in args))
    subprocess.run(args, check=True, **kwargs)


def serve_and_ask(command, cwd, env, started):
    """Starts `command` (a `serve`), waits for its listeners, asks the first request.

    Returns (seconds to ready, seconds to first answer), counted from `started`."""
    env = dict(env)
    # Loopback and free ports only; JSON logs to find the ports it took.
    env.update(
        CELLRATE_LISTEN="127.0.0.1:0",
        CELLRATE_ADMIN_LISTEN="127.0.0.1:0",
        CELLRATE_METRICS_LISTEN="127.0.0.1:0",
        CELLRATE_LOG_FORMAT="json",
    )
    log("$ " + " ".join(command))
    server = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    # A build or server that goes silent is killed at the deadline, which ends the read.
    watchdog = threading.Timer(BUILD_DEADLINE_S, os.killpg, (server.pid, signal.SIGKILL))
    watchdog.start()
    try:
        listen = None
        # cargo's own progress lines come first, then the server's JSON lines.
        for line in server.stderr:
            if '"cellrate serving"' in line:
                listen = json.loads(line)["fields"]["listen"]
                break
            if not line.startswith("{"):
                sys.stderr.write(line)
        if listen is None:
            raise SystemExit(f"fresh-machine: `{' '.join(command)}` never served")
        watchdog.cancel()
        ready = time.monotonic() - started
        # Drain the rest of its log so it never blocks writing.
        subprocess.Popen(["cat"], stdin=server.stderr, stdout=subprocess.DEVNULL)
        answer = subprocess.run(
            ["grpcurl", "-plaintext", "-emit-defaults", "-max-time", "10"]
            + ["-d", json.dumps(FIRST_REQUEST), listen, "cellrate.v1.RateLimiter/Check"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if answer.returncode != 0:
            raise SystemExit(f"fresh-machine: the first request failed: {answer.stderr}")
        overall = json.loads(answer.stdout)["overall"]
        if overall["allowed"] is not True or overall["remaining"] != "299":
            raise SystemExit(f"fresh-machine: unexpected first answer: {answer.stdout}")
        return ready, time.monotonic() - started
    finally:
        watchdog.cancel()
        try:
            os.killpg(server.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    options = parser.parse_args()

    work = tempfile.mkdtemp(prefix="cellrate-fresh-")
    try:
        clone = os.path.join(work, "clone")
        cargo_home = os.path.join(work, "cargo-home")
        os.makedirs(cargo_home)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CARGO")}
        env.update(CARGO_HOME=cargo_home, CARGO_TERM_COLOR="never")

        started = time.monotonic()
        run(["git", "clone", "--quiet", "--no-hardlinks", REPO, clone])
        cloned = time.monotonic() - started
        # The README's first command, as written.
        ready, answered = serve_and_ask(
            ["cargo", "run", "--release", "--", "serve"], clone, env, started
        )
        log(
            f"time to first answer from a clean clone with an empty cargo home: "
            f"clone {cloned:.0f} s, serve ready {ready:.0f} s, first Check answered "
            f"{answered:.0f} s"
        )
    finally:
        if options.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
