#!/usr/bin/env python3
"""The instance watchdog: spot interruptions and idle GPUs.

It hands a spot interruption to the trainer and ends a job whose GPU sits idle.

Standard library only, so it runs on any instance, before (or without) the project's environment:

    python3 watchdog.py --pid JOB_PID [--idle-minutes 30] [--marker RUN_DIR/watchdog.json]
    python3 watchdog.py --idle-minutes 30          # a dev box: no job; power off when idle

Every `--poll` seconds (AWS suggests 5) it asks the instance metadata service (IMDSv2) for
`spot/instance-action`: 404 means nothing is planned, a JSON body means AWS reclaims the instance in
about two minutes. Every `--gpu-every` seconds it samples `nvidia-smi`. It acts once, then exits:

- spot notice, or GPU utilisation at or under `--threshold` % for `--idle-minutes`: SIGTERM to the
  job's direct children (papermill's kernel, where the trainer checkpoints on SIGTERM) or to the job
  itself when it has none; wait `--grace` seconds for the job to end, then SIGKILL what is left. The
  job script's exit trap uploads the run dir and powers the machine off.
- idle with no `--pid` (a dev box): `shutdown -h now`. The instance's shutdown behaviour decides
  whether that stops it (dev box) or terminates it (job instance).
- the job ended by itself: nothing to do.

`qmind aws watchdog` runs this same file (qmind_render.sweeps.cloud_jobs.watchdog_main).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

IMDS = "http://169.254.169.254"
TOKEN_TTL_S = 21600


def imds_token(base: str = IMDS, timeout: float = 1.0) -> str | None:
    "An IMDSv2 session token, or None when the metadata service does not answer."
    req = urllib.request.Request(
        f"{base}/latest/api/token",
        method="PUT",
        headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.read().decode()
    except (urllib.error.URLError, OSError):
        return None


def spot_notice(base: str = IMDS, token: str | None = None, timeout: float = 1.0) -> dict | None:
    """The pending `spot/instance-action` ({'action': 'terminate'|'stop'|'hibernate', 'time': ...})
    or None."""
    headers = {"X-aws-ec2-metadata-token": token} if token else {}
    req = urllib.request.Request(f"{base}/latest/meta-data/spot/instance-action", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            body = r.read().decode()
    except urllib.error.HTTPError as e:
        if e.code == 401:
            raise PermissionError("IMDSv2 token rejected") from None
        return None  # 404: no interruption scheduled
    except (urllib.error.URLError, OSError):
        return None
    try:
        notice = json.loads(body)
    except json.JSONDecodeError:
        return None
    return notice if isinstance(notice, dict) and notice.get("action") else None


def gpu_utilisation() -> list[float] | None:
    """Utilisation (%) of every GPU, or None where there is no `nvidia-smi` (the idle check is then
    off)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode:
        return None
    vals = [float(x) for x in out.stdout.split() if x.replace(".", "", 1).isdigit()]
    return vals or None


class IdleTracker:
    """Idle = every GPU at or under `threshold` % in every sample for `window_s` seconds. Times are
    passed in."""

    def __init__(self, window_s: float = 1800, threshold: float = 5.0):
        self.window_s, self.threshold, self.idle_since = window_s, threshold, None

    def observe(self, now: float, util: list[float] | None) -> bool:
        """Record one sample taken at `now`; True once the samples have been idle for the whole
        window."""
        if util is None:
            return False  # no GPU to watch: never idle
        if max(util) > self.threshold:
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = now
        return self.idle_since is not None and now - self.idle_since >= self.window_s


def decide(notice: dict | None, idle: bool, job_alive: bool | None) -> str | None:
    "What to do now: 'spot', 'idle', 'done' (the job ended by itself) or None (keep watching)."
    if notice:
        return "spot"
    if job_alive is False:
        return "done"
    if idle:
        return "idle"
    return None


def _proc_stat(pid: int) -> tuple[str, int] | None:
    "(state, ppid) from /proc, or None when the process is gone."
    try:
        s = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = s[s.rindex(")") + 2 :].split()
    return fields[0], int(fields[1])


def alive(pid: int) -> bool:
    "Is `pid` running (a zombie waiting to be reaped counts as ended)?"
    st = _proc_stat(pid)
    if st is not None:
        return st[0] not in ("Z", "X")
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def children(pid: int) -> list[int]:
    "The direct children of `pid` (Linux /proc)."
    out = []
    for d in Path("/proc").glob("[0-9]*"):
        st = _proc_stat(int(d.name))
        if st and st[1] == pid:
            out.append(int(d.name))
    return sorted(out)


def interrupt(
    pid: int, grace_s: float = 90, sleep=time.sleep, clock=time.monotonic, log=print
) -> bool:
    """SIGTERM the job's children (or the job); SIGKILL whatever remains after `grace_s`. True if it
    ended in time."""
    targets = children(pid) or [pid]
    log(
        f"watchdog: SIGTERM to {targets} (job {pid}); waiting up to {grace_s:.0f}s for a checkpoint"
    )
    for t in targets:
        try:
            os.kill(t, signal.SIGTERM)
        except ProcessLookupError:
            pass
    end = clock() + grace_s
    while clock() < end:
        if not alive(pid):
            return True
        sleep(0.2)
    for t in [*children(pid), pid]:
        try:
            os.kill(t, signal.SIGKILL)
        except ProcessLookupError:
            pass
    log(f"watchdog: job {pid} did not end within {grace_s:.0f}s; killed")
    return False


def poweroff(log=print) -> None:
    log("watchdog: idle; shutting down")
    subprocess.run(["shutdown", "-h", "now", "qmind watchdog: GPU idle"], check=False)


def watch(
    pid: int | None = None,
    imds: str = IMDS,
    poll_s: float = 5,
    gpu_every_s: float = 60,
    tracker: IdleTracker | None = None,
    grace_s: float = 90,
    probe=gpu_utilisation,
    clock=time.monotonic,
    sleep=time.sleep,
    log=print,
    on_idle=poweroff,
) -> tuple[str, dict | None]:
    "Watch until something happens; act on it; return (reason, spot notice or None)."
    tracker = tracker or IdleTracker()
    token, token_at, next_gpu, idle, warned = None, -1e18, clock(), False, False
    while True:
        now = clock()
        if now - token_at > TOKEN_TTL_S / 2:
            token, token_at = imds_token(imds), now
        try:
            notice = spot_notice(imds, token)
        except PermissionError:
            token, token_at, notice = None, -1e18, None
        if now >= next_gpu:
            util, next_gpu = probe(), now + gpu_every_s
            if util is None and not warned:
                log("watchdog: no GPU utilisation (nvidia-smi); the idle check is off")
            idle, warned = tracker.observe(now, util), warned or util is None
        reason = decide(notice, idle, alive(pid) if pid else None)
        if reason == "spot":
            log(f"watchdog: spot interruption notice {notice}")
        if reason in ("spot", "idle"):
            if pid:
                interrupt(pid, grace_s, sleep=sleep, clock=clock, log=log)
            else:
                on_idle(log=log)
        if reason:
            return reason, notice
        sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="watchdog", description=__doc__.split("\n")[0])
    p.add_argument(
        "--pid", type=int, default=None, help="the job's process (default: none, a dev box)"
    )
    p.add_argument(
        "--idle-minutes",
        type=float,
        default=30.0,
        help="GPU idle this long ends the job (default 30)",
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=5.0,
        help="utilisation %% that still counts as idle (default 5)",
    )
    p.add_argument(
        "--poll", type=float, default=5.0, help="seconds between metadata polls (default 5)"
    )
    p.add_argument(
        "--gpu-every", type=float, default=60.0, help="seconds between GPU samples (default 60)"
    )
    p.add_argument(
        "--grace", type=float, default=90.0, help="seconds the job gets to checkpoint (default 90)"
    )
    p.add_argument(
        "--imds", default=IMDS, help="instance metadata endpoint (tests point it elsewhere)"
    )
    p.add_argument("--marker", default=None, help="write {reason, notice} as JSON here when acting")
    a = p.parse_args(argv)
    log = lambda m: print(m, flush=True)
    reason, notice = watch(
        a.pid,
        a.imds,
        a.poll,
        a.gpu_every,
        IdleTracker(a.idle_minutes * 60, a.threshold),
        a.grace,
        log=log,
    )
    if a.marker and reason != "done":
        Path(a.marker).parent.mkdir(parents=True, exist_ok=True)
        Path(a.marker).write_text(json.dumps({"reason": reason, "notice": notice}) + "\n")
    log(f"watchdog: {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
