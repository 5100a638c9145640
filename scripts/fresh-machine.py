#!/usr/bin/env python3
"""What a newcomer and an image build meet on a fresh machine, checked for real.

1. A clean clone of HEAD, an empty cargo home: the README's first command
   (`cargo run --release -- serve`) builds, serves, and answers the README's first request
   (grpcurl, `Check`). The time to each step is printed: clone, serve ready, first answer.
2. The Dockerfile's build stage, replayed outside Docker (no engine here): its COPYs from
   the clone, its stub targets and its RUN commands as the Dockerfile writes them, offline,
   with only what step 1 downloaded. So the image build needs nothing that the plain build
   does not, and the binary the run stage copies exists and validates the limits it ships.

The replay's build argument PROFILE is `release` unless --docker-profile says otherwise:
that is the profile step 1 compiled, so the replay reuses its compiled dependencies (the
image's default, release-lto, is the same dependency graph with other codegen settings and
takes minutes longer). The replay uses this machine's toolchain, not the rust image's.

Usage: scripts/fresh-machine.py [--docker-profile P] [--keep]
Every wait is bounded; the server listens on loopback only and is stopped at the end.
"""

import argparse
import json
import os
import re
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


def dockerfile_build_stage(path):
    """The instructions of the Dockerfile's first stage: (keyword, text), continuations
    joined, comments left out."""
    text = open(path).read().replace("\\\n", " ")
    stage = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            if stage:
                break
            stage.append((keyword, rest.strip()))
            continue
        stage.append((keyword, rest.strip()))
    return stage


def replay_build_stage(context, image_root, env, build_args):
    """Replays the build stage's WORKDIR, ARG, ENV, COPY and RUN under `image_root` (the
    image's `/`), copying from `context`. Returns the stage's variables."""
    workdir = "/"
    variables = {}

    def host(path):
        path = path if path.startswith("/") else os.path.join(workdir, path)
        return os.path.join(image_root, path.lstrip("/"))

    for keyword, rest in dockerfile_build_stage(os.path.join(context, "Dockerfile")):
        if keyword == "FROM":
            log(f"build stage: FROM {rest} (replayed on this machine's toolchain)")
        elif keyword == "WORKDIR":
            workdir = rest
            os.makedirs(host("."), exist_ok=True)
        elif keyword == "ARG":
            name, _, default = rest.partition("=")
            variables[name] = build_args.get(name, default)
        elif keyword == "ENV":
            for name, value in re.findall(r'(\w+)=("[^"]*"|\S+)', rest):
                variables[name] = value.strip('"')
        elif keyword == "COPY":
            *sources, dest = shlex.split(rest)
            if any(s.startswith("--") for s in sources):
                raise SystemExit(f"fresh-machine: COPY flags are not replayed: {rest}")
            for source in sources:
                src = os.path.join(context, source)
                target = host(dest)
                if dest.endswith("/") or len(sources) > 1:
                    target = os.path.join(target, os.path.basename(source.rstrip("/")))
                if os.path.isdir(src):
                    shutil.copytree(src, target, dirs_exist_ok=True)
                else:
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    shutil.copy2(src, target)
            log(f"COPY {rest}")
        elif keyword == "RUN":
            # Run here, a RUN may touch only the stage's working directory.
            if re.search(r"(^|\s)/", rest):
                raise SystemExit(f"fresh-machine: a RUN with an absolute path: {rest}")
            run(["sh", "-c", rest], cwd=host("."), env={**env, **variables})
        else:
            raise SystemExit(f"fresh-machine: {keyword} is not replayed")
    return variables


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docker-profile", default="release")
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

        # The image's build stage: offline, with what the plain build downloaded.
        image = os.path.join(work, "image")
        os.makedirs(os.path.join(image, "src"))
        # Its target directory is the clone's, so compiled dependencies are reused.
        os.symlink(os.path.join(clone, "target"), os.path.join(image, "src", "target"))
        replay_started = time.monotonic()
        variables = replay_build_stage(
            clone,
            image,
            {**env, "CARGO_NET_OFFLINE": "true"},
            {"PROFILE": options.docker_profile},
        )
        binary = os.path.join(image, "src/cellrate")
        if not os.access(binary, os.X_OK):
            raise SystemExit(f"fresh-machine: the build stage left no {binary}")
        run([binary, "validate", os.path.join(clone, "config")], env=env)
        log(
            f"the Dockerfile's build stage (PROFILE={variables.get('PROFILE')}) replayed "
            f"offline in {time.monotonic() - replay_started:.0f} s"
        )
    finally:
        if options.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
