"""The cloud stage against real AWS APIs on loopback: moto_server for S3, EC2 (spot included), IAM,
STS, Budgets, Cost Explorer, SageMaker and Batch; small servers of our own where moto has no model
(the instance metadata service's spot/instance-action, Service Quotas for EC2, a throttling API).
Every server listens on 127.0.0.1 and stops with its test."""

import base64
import datetime as dt
import functools
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import boto3
import pytest
import yaml
from botocore.exceptions import ClientError

from qmind_render.sweeps import cloud, cloud_batch, cloud_cli, cloud_guard, cloud_jobs
from qmind_render.sweeps.cloud import CloudError, RunSpec
from qmind_render.sweeps.cloud_guard import OverBudget
from qmind_render.sweeps.cloud_jobs import EC2Backend, LaunchFailed, SageMakerBackend

ROOT = Path(__file__).resolve().parents[1]
STORE = "s3://qmind-lab/main"


# --- fixtures ------------------------------------------------------------------------------------


def _post(url: str, body: dict) -> None:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=10).read()


@pytest.fixture
def aws(aws_env, monkeypatch):
    "A fresh moto state (every service) and a session on it; Batch without Docker."
    _post(f"{aws_env}/moto-api/reset", {})
    _post(f"{aws_env}/moto-api/config", {"batch": {"use_docker": False}})
    monkeypatch.delenv("QMIND_OWNER", raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return cloud.aws_session()


@pytest.fixture
def store(aws):
    """The project bucket in us-east-1 with a committed dataset ds-v003 (a manifest is all a launch
    checks)."""
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="qmind-lab")
    s3.put_object(Bucket="qmind-lab", Key="main/datasets/ds-v003/manifest.json", Body=b"{}")
    return STORE


@pytest.fixture
def ready(aws, store):
    """What `qmind aws setup` makes (roles, instance profile, tagged bucket) and a $5,000 budget
    with alerts."""
    cloud.setup(aws, store, owner="alice")
    cloud_guard.ensure_budget(aws, 5000, ["infra@example.org"], owner="alice")
    return aws


def run_spec(name="003-coverage_50-s1", estimate=None, store=STORE, **data):
    from qmind_render.core.config import config_to_dict, load_config

    cfg = config_to_dict(
        load_config(
            None,
            [
                f"name={name}",
                "seed=1",
                f"data.store={store}",
                "data.dataset=ds-v003",
                *[f"data.{k}={v}" for k, v in data.items()],
            ],
        )
    )
    return RunSpec(name, cfg, estimate_usd=estimate)


@functools.cache
def moto_ami() -> str:
    """An image moto serves (the same after every reset). Asked once: listing moto's 1,177 Amazon
    images takes it 2-4 s of CPU."""
    return boto3.client("ec2").describe_images(Owners=["amazon"])["Images"][0]["ImageId"]


def ec2_backend(**kw) -> EC2Backend:
    kw = {
        "instance": "g6.xlarge",
        "market": "spot",
        "max_hours": 4,
        "image_id": moto_ami(),
        "poll_s": 0.05,
        "start_timeout_s": 5,
        "code_uri": f"{STORE}/code/test.tar.gz",
        **kw,
    }
    return EC2Backend(**kw)


def tags_of(res: dict) -> dict:
    return {t["Key"]: t["Value"] for t in res.get("Tags", [])}


def live_instances() -> list[dict]:
    r = boto3.client("ec2").describe_instances(
        Filters=[{"Name": "instance-state-name", "Values": ["pending", "running", "stopped"]}]
    )
    return [i for res in r["Reservations"] for i in res["Instances"]]


class Server:
    "A ThreadingHTTPServer on 127.0.0.1 in a thread, for a handler class; stopped by `close`."

    def __init__(self, handler):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


# --- EC2 -----------------------------------------------------------------------------------------


def test_ec2_launch_tags_everything_and_runs_self_terminating(ready):
    be = ec2_backend(owner="alice", code_uri=None, allow_dirty=True)
    job = be.submit(run_spec(), dry_run=False)
    ec2 = boto3.client("ec2")
    inst = ec2.describe_instances(InstanceIds=[job["instance_id"]])["Reservations"][0]["Instances"][
        0
    ]
    want = {"owner": "alice", "project": "qmind-render", "run": "003-coverage_50-s1"}
    # 4 h × $0.805
    assert want.items() <= tags_of(inst).items() and tags_of(inst)["qmind:estimate-usd"] == "3.22"
    # its cap, which the guard counts
    assert tags_of(inst)["qmind:max-usd"] == "3.22"
    vols = ec2.describe_volumes(
        Filters=[{"Name": "attachment.instance-id", "Values": [job["instance_id"]]}]
    )["Volumes"]
    assert vols and all(want.items() <= tags_of(v).items() for v in vols)
    assert inst["InstanceLifecycle"] == "spot" and inst["IamInstanceProfile"]["Arn"].endswith(
        "/qmind-render-job"
    )
    attr = ec2.describe_instance_attribute(
        InstanceId=job["instance_id"], Attribute="instanceInitiatedShutdownBehavior"
    )
    assert attr["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
    ud = ec2.describe_instance_attribute(InstanceId=job["instance_id"], Attribute="userData")[
        "UserData"
    ]["Value"]
    script = base64.b64decode(ud).decode()
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert "trap finish EXIT" in script and "RUN_NAME=003-coverage_50-s1" in script
    s3 = boto3.client("s3")
    assert job["code_uri"].startswith(f"{STORE}/code/")
    assert (
        s3.head_object(Bucket="qmind-lab", Key=cloud.split_s3(job["code_uri"])[1])["ContentLength"]
        > 10_000
    )
    rec = json.loads(
        s3.get_object(Bucket="qmind-lab", Key="main/runs/003-coverage_50-s1/job.json")[
            "Body"
        ].read()
    )
    assert rec["instance_id"] == job["instance_id"]
    assert be.status(job) == "running"
    be.cancel(job)
    assert be.status(job) == "failed"  # terminated without a status.json
    s3.put_object(
        Bucket="qmind-lab", Key="main/runs/003-coverage_50-s1/status.json", Body=b'{"exit_code": 0}'
    )
    assert be.status(job) == "done"


def test_ec2_owner_comes_from_sts_when_unset(ready):
    job = ec2_backend(market="on-demand").submit(run_spec())
    inst = boto3.client("ec2").describe_instances(InstanceIds=[job["instance_id"]])["Reservations"][
        0
    ]["Instances"][0]
    assert tags_of(inst)["owner"] == "moto" and "InstanceLifecycle" not in inst


def test_guard_charges_the_cap_not_the_estimate_and_counts_live_caps(aws, store):
    cloud.setup(aws, store, owner="alice")
    acct = boto3.client("sts").get_caller_identity()["Account"]
    boto3.client("budgets").create_budget(
        AccountId=acct,
        Budget={
            "BudgetName": "qmind-render",
            "BudgetType": "COST",
            "TimeUnit": "ANNUALLY",
            "BudgetLimit": {"Amount": "100", "Unit": "USD"},
            "CalculatedSpend": {"ActualSpend": {"Amount": "94", "Unit": "USD"}},
        },
    )  # $6 left
    # the planner's $0.45 fits in $6, but 24 hours at $0.805/h, which the instance may run, do not
    with pytest.raises(
        OverBudget,
        match=r"may cost up to \$19.32 \(\$0.805/h × 24 h\); the planner estimates \$0.45.*"
        r"exceeds what is left.*\$6.00.*Lower --max-hours",
    ):
        ec2_backend(owner="alice", max_hours=24).submit(run_spec(estimate=0.45))
    assert live_instances() == []
    # cap $3.22: fits
    ec2_backend(owner="alice", max_hours=4).submit(run_spec("a-s1", estimate=0.45))
    # its cap is committed, not its $0.45
    with pytest.raises(OverBudget, match=r"live jobs up to \$3.22"):
        ec2_backend(owner="alice", max_hours=4).submit(run_spec("a-s2", estimate=0.45))
    assert len(live_instances()) == 1
    with pytest.raises(
        OverBudget,
        match=r"sweep \(3 runs\): it may cost up to \$4.83 \(3 runs × \$0.805/h × 2 h\); "
        r"the planner estimates \$0.30",
    ):  # $2.78 left
        cloud_guard.check_sweep(
            ec2_backend(max_hours=2),
            [run_spec(f"b-s{i}", estimate=0.1) for i in range(3)],
            cloud_guard.BudgetGuard(session=aws),
            "sweep",
        )


def test_no_budget_no_launch(aws, store):
    cloud.setup(aws, store, owner="alice")
    with pytest.raises(CloudError, match="budget alerts.*qmind aws budget --create"):
        ec2_backend(owner="alice").submit(run_spec())
    assert live_instances() == []


def test_bucket_in_another_region_is_refused(ready):
    boto3.client("s3", region_name="eu-west-1").create_bucket(
        Bucket="qmind-eu", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"}
    )
    with pytest.raises(
        CloudError, match="bucket qmind-eu is in eu-west-1 but jobs would launch in us-east-1"
    ):
        ec2_backend(owner="alice").submit(run_spec(store="s3://qmind-eu/main"))
    assert live_instances() == []


def test_unknown_instance_type_and_missing_dataset(ready):
    with pytest.raises(
        CloudError, match="unknown instance type 'g6e.xlarg': did you mean g6e.xlarge"
    ):
        ec2_backend(instance="g6e.xlarg").submit(run_spec())
    with pytest.raises(CloudError, match="dataset ds-v004 is not committed"):
        ec2_backend(owner="alice").submit(run_spec(dataset="ds-v004"))
    assert live_instances() == []


def test_missing_credentials_and_region_are_clear(monkeypatch, tmp_path):
    for k in (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_DEFAULT_REGION",
        "AWS_REGION",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
    ):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    # never ask 169.254.169.254
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(CloudError, match="no AWS credentials found in the standard chain"):
        cloud.aws_session()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with pytest.raises(CloudError, match="no AWS region"):
        cloud.aws_session()
    # a dry run calls no AWS API, so it works without credentials
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    assert (
        cloud_cli.aws_main(["launch", f"data.store={STORE}", "--owner", "alice", "--dry-run"]) == 0
    )


class _PendingForever:
    """A real moto EC2 client whose instances never leave 'pending', as when AWS cannot fulfil a
    spot request."""

    def __init__(self, ec2):
        self.ec2 = ec2

    def __getattr__(self, name):
        return getattr(self.ec2, name)

    def describe_instances(self, **kw):
        r = self.ec2.describe_instances(**kw)
        for res in r["Reservations"]:
            for i in res["Instances"]:
                i["State"] = {"Code": 0, "Name": "pending"}
        return r


def test_spot_never_fulfilled_times_out_and_leaves_nothing(ready, monkeypatch):
    real = cloud.aws_client
    monkeypatch.setattr(
        cloud,
        "aws_client",
        lambda s, svc, **kw: (
            _PendingForever(real(s, svc, **kw)) if svc == "ec2" else real(s, svc, **kw)
        ),
    )
    t = time.monotonic()
    with pytest.raises(
        LaunchFailed, match=r"not running after 0s.*terminated and its spot request cancelled"
    ):
        ec2_backend(owner="alice", start_timeout_s=0.2).submit(run_spec())
    assert time.monotonic() - t < 30
    assert live_instances() == []
    vols = boto3.client("ec2").describe_volumes(
        Filters=[{"Name": "tag:run", "Values": ["003-coverage_50-s1"]}]
    )["Volumes"]
    # no orphaned disk
    assert all(v["State"] != "available" for v in vols)


def test_capacity_error_is_clear_and_creates_nothing(ready, monkeypatch):
    class NoCapacity(_PendingForever):
        def run_instances(self, **kw):
            raise ClientError(
                {
                    "Error": {
                        "Code": "InsufficientInstanceCapacity",
                        "Message": "We currently do not have sufficient g6.xlarge capacity",
                    }
                },
                "RunInstances",
            )

    real = cloud.aws_client
    monkeypatch.setattr(
        cloud,
        "aws_client",
        lambda s, svc, **kw: NoCapacity(real(s, svc, **kw)) if svc == "ec2" else real(s, svc, **kw),
    )
    with pytest.raises(CloudError, match="InsufficientInstanceCapacity.*another availability zone"):
        ec2_backend(owner="alice").submit(run_spec())
    assert live_instances() == []


# --- the job script ------------------------------------------------------------------------------

FAKE_AWS = r"""#!/bin/bash
# fake `aws s3 cp|sync` over a directory standing in for S3; logs every call
echo "aws $*" >> "$FAKE_LOG"
loc() { echo "$FAKE_S3/${1#s3://}"; }
[ "$1" = s3 ] || exit 0
case "$2" in
  cp) if [ "$4" = - ]; then cat "$(loc "$3")"; else mkdir -p "$(dirname "$(loc "$4")")"; cp "$3" "$(loc "$4")"; fi ;;
  sync) src=$3; dst=$4
        [[ $src == s3://* ]] && src=$(loc "$src"); [[ $dst == s3://* ]] && dst=$(loc "$dst")
        mkdir -p "$dst"; [ -d "$src" ] && cp -r "$src/." "$dst/" ;;
esac
exit 0
"""  # noqa: E501 (a shell script)
FAKE_PYTHON = r"""#!/bin/bash
# fake interpreter: `-m venv DIR` makes a venv whose pip does nothing; the watchdog just waits to be killed
if [ "$1" = -m ] && [ "$2" = venv ]; then mkdir -p "$3/bin"; printf '#!/bin/sh\necho "pip $*" >> "$FAKE_LOG"\n' > "$3/bin/pip"; chmod +x "$3/bin/pip"; exit 0; fi
case "$1" in *watchdog.py) echo "watchdog $*" >> "$FAKE_LOG"; exec sleep 60 ;; esac
exec python3 "$@"
"""  # noqa: E501 (a shell script: its lines are as the instance runs them)
FAKE_PAPERMILL = r"""#!/bin/bash
echo "papermill $*" >> "$FAKE_LOG"
cp "$4" "$(dirname "$2")/params-seen.yaml"
echo '{"cells": []}' > "$2"
exit "$FAKE_PAPERMILL_RC"
"""  # noqa: E501 (a shell script)


@pytest.mark.parametrize("papermill_rc", [0, 3])
def test_job_script_uploads_and_powers_off_on_success_and_failure(tmp_path, papermill_rc):
    bin_, s3, root = tmp_path / "bin", tmp_path / "s3", tmp_path / "opt"
    bin_.mkdir()
    for name, text in (
        ("aws", FAKE_AWS),
        ("fakepython", FAKE_PYTHON),
        ("papermill", FAKE_PAPERMILL),
        ("shutdown", '#!/bin/sh\necho "shutdown $*" >> "$FAKE_LOG"\n'),
    ):
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    code = s3 / "qmind-lab/main/code/abc.tar.gz"
    code.parent.mkdir(parents=True)
    with tarfile.open(code, "w:gz") as t:
        t.add(ROOT / "infra/requirements.lock", "infra/requirements.lock")
        t.add(ROOT / "qmind_render/assets/watchdog.py", "qmind_render/assets/watchdog.py")
    (s3 / "qmind-lab/main/runs/r1").mkdir(parents=True)
    (s3 / "qmind-lab/main/runs/r1/0000100.pt").write_text("checkpoint from an earlier attempt")
    run = run_spec("r1")
    script = cloud_jobs.render_user_data(
        run, f"{STORE}/code/abc.tar.gz", "us-east-1", max_hours=2, python="fakepython"
    )
    log = tmp_path / "calls.log"
    env = {
        "PATH": f"{bin_}:{os.environ['PATH']}",
        "FAKE_S3": str(s3),
        "FAKE_LOG": str(log),
        "HOME": str(tmp_path),
        "FAKE_PAPERMILL_RC": str(papermill_rc),
        "QMIND_JOB_ROOT": str(root),
        "QMIND_JOB_LOG": str(tmp_path / "job.log"),
    }
    r = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == papermill_rc, r.stdout + r.stderr
    calls = log.read_text().splitlines()
    # the backstop comes first
    assert calls[0] == "shutdown -h +120 qmind: maximum runtime reached"
    # and the job ends the machine
    assert calls[-1] == "shutdown -h now qmind: job finished"
    up = s3 / "qmind-lab/main/runs/r1"
    assert json.loads((up / "status.json").read_text()) == {"run": "r1", "exit_code": papermill_rc}
    assert (up / "job.log").is_file() and (up / "train.ipynb").is_file()
    # the run dir was restored first
    assert (root / "src/runs/r1/0000100.pt").is_file()
    params = yaml.safe_load((up / "params-seen.yaml").read_text())
    assert params == {"config": "runs/r1/config.yaml", "overrides": [], "seed": 1, "run_name": "r1"}
    assert yaml.safe_load((up / "config.yaml").read_text())["data"]["dataset"] == "ds-v003"
    assert any(c.startswith("aws s3 sync s3://qmind-lab/main/datasets/ds-v003") for c in calls)
    assert any(c.startswith("pip install --quiet --no-cache-dir -r") for c in calls)
    assert "export QMIND_GIT_COMMIT=abc " in script


def test_user_data_is_valid_shell_for_awkward_values():
    run = run_spec("x-s1", store="s3://qmind-lab/it's here")
    run.config["name"] = "it's $(rm -rf /) `x`"
    script = cloud_jobs.render_user_data(run, "s3://b/code/a b.tar.gz", "us-east-1", 1.5)
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0
    assert "DATA_URI='s3://qmind-lab/it'\"'\"'s here/datasets/ds-v003'" in script


# --- the watchdog --------------------------------------------------------------------------------


class FakeIMDS(BaseHTTPRequestHandler):
    """IMDSv2: a token from PUT /latest/api/token; spot/instance-action is 404 until `notice_after`
    polls."""

    polls, notice_after, tokens_ok = 0, 10**9, True

    def log_message(self, *a):
        pass

    def do_PUT(self):
        assert (
            self.path == "/latest/api/token"
            and self.headers["X-aws-ec2-metadata-token-ttl-seconds"]
        )
        self._send(200, b"tok-123")

    def do_GET(self):
        cls = type(self)
        if self.headers.get("X-aws-ec2-metadata-token") != "tok-123":
            return self._send(401, b"")
        assert self.path == "/latest/meta-data/spot/instance-action"
        cls.polls += 1
        if cls.polls <= cls.notice_after:
            return self._send(404, b"Not Found")
        self._send(
            200, json.dumps({"action": "terminate", "time": "2026-10-02T08:22:00Z"}).encode()
        )

    def _send(self, code, body):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


TRAINER = textwrap.dedent("""
    import signal, subprocess, sys, time
    from pathlib import Path
    if sys.argv[1] == "parent":     # papermill's place: waits on its kernel
        sys.exit(subprocess.run([sys.executable, __file__, "kernel", sys.argv[2]]).returncode)
    def on_term(*_):                # the trainer: checkpoint, then exit
        Path(sys.argv[2]).write_text("step 1234"); sys.exit(143)
    signal.signal(signal.SIGTERM, on_term)
    Path(sys.argv[2] + ".ready").write_text("")
    while True: time.sleep(0.05)
""")


def _start_job(tmp_path):
    (tmp_path / "trainer.py").write_text(TRAINER)
    ckpt = tmp_path / "ckpt.txt"
    job = subprocess.Popen([sys.executable, str(tmp_path / "trainer.py"), "parent", str(ckpt)])
    deadline = time.monotonic() + 20
    while not Path(str(ckpt) + ".ready").exists():
        assert time.monotonic() < deadline, "trainer did not start"
        time.sleep(0.05)
    return job, ckpt


def test_watchdog_hands_a_spot_notice_to_the_trainer(tmp_path):
    FakeIMDS.polls, FakeIMDS.notice_after = 0, 3
    srv = Server(FakeIMDS)
    job, ckpt = _start_job(tmp_path)
    try:
        r = subprocess.run(
            [
                sys.executable,
                str(ROOT / "qmind_render/assets/watchdog.py"),
                "--pid",
                str(job.pid),
                "--imds",
                srv.url,
                "--poll",
                "0.05",
                "--grace",
                "15",
                "--marker",
                str(tmp_path / "wd.json"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        srv.close()
        job.kill() if job.poll() is None else None
    assert r.returncode == 0 and "watchdog: spot" in r.stdout, r.stdout + r.stderr
    # the trainer's SIGTERM handler ran
    assert ckpt.read_text() == "step 1234"
    assert job.wait(timeout=10) == 143  # the job ended through it
    assert json.loads((tmp_path / "wd.json").read_text())["notice"]["action"] == "terminate"
    assert FakeIMDS.polls == 4


def test_watchdog_ends_a_job_whose_gpu_idles_30_minutes(tmp_path):
    FakeIMDS.polls, FakeIMDS.notice_after = 0, 10**9
    srv = Server(FakeIMDS)
    job, ckpt = _start_job(tmp_path)
    wd = cloud_jobs.load_watchdog()
    now = [0.0]
    util = iter([[80.0], [2.0]] + [[0.0]] * 100)  # busy at first, then idle
    try:
        reason, notice = wd.watch(
            job.pid,
            srv.url,
            poll_s=60,
            gpu_every_s=60,
            tracker=wd.IdleTracker(1800, 5.0),
            grace_s=15,
            probe=lambda: next(util),
            clock=lambda: now[0],
            sleep=lambda s: now.__setitem__(0, now[0] + s) or time.sleep(0.001),
            log=lambda m: None,
        )
    finally:
        srv.close()
    assert (reason, notice) == ("idle", None)
    # idle since the second sample, 30 min later
    assert 1800 <= now[0] <= 1800 + 2 * 60 + 15
    assert ckpt.read_text() == "step 1234" and job.wait(timeout=10) == 143


def test_watchdog_on_a_dev_box_powers_off_and_without_gpu_never_idles(tmp_path):
    FakeIMDS.polls, FakeIMDS.notice_after = 0, 10**9
    srv = Server(FakeIMDS)
    wd, now, off = cloud_jobs.load_watchdog(), [0.0], []
    tick = lambda s: now.__setitem__(0, now[0] + s)
    try:
        reason, _ = wd.watch(
            None,
            srv.url,
            poll_s=60,
            probe=lambda: [0.0],
            clock=lambda: now[0],
            sleep=tick,
            log=lambda m: None,
            on_idle=lambda log: off.append(now[0]),
        )
        assert reason == "idle" and off == [1800.0]
        tracker = wd.IdleTracker(60)
        assert not any(tracker.observe(t, None) for t in range(0, 10**5, 60))
    finally:
        srv.close()
    # no metadata service at all (not on EC2): no notice, quickly
    t = time.monotonic()
    assert wd.spot_notice("http://127.0.0.1:9", timeout=0.5) is None and time.monotonic() - t < 5


# --- SageMaker ----------------------------------------------------------------------------------


def test_sagemaker_job_managed_spot_checkpoints_max_runtime_tags(ready):
    be = SageMakerBackend(
        max_hours=6,
        image="123456789012.dkr.ecr.us-east-1.amazonaws.com/qmind-render:abc",
        role_arn="arn:aws:iam::123456789012:role/qmind-render-sagemaker",
        owner="alice",
    )
    job = be.submit(run_spec(estimate=5))
    sm = boto3.client("sagemaker")
    d = sm.describe_training_job(TrainingJobName=job["training_job"])
    assert d["EnableManagedSpotTraining"] is True
    assert d["CheckpointConfig"]["S3Uri"] == f"{STORE}/runs/003-coverage_50-s1/"
    assert d["StoppingCondition"] == {
        "MaxRuntimeInSeconds": 6 * 3600,
        "MaxWaitTimeInSeconds": 12 * 3600,
    }
    tags = {t["Key"]: t["Value"] for t in sm.list_tags(ResourceArn=job["training_job_arn"])["Tags"]}
    assert (
        tags["owner"] == "alice"
        and tags["project"] == "qmind-render"
        and tags["qmind:estimate-usd"] == "5.00"
    )
    # 6 h × $1.41: what the guard counts while it runs
    assert tags["qmind:max-usd"] == "8.46"
    cfg = (
        boto3.client("s3")
        .get_object(Bucket="qmind-lab", Key="main/runs/003-coverage_50-s1/config.yaml")["Body"]
        .read()
    )
    assert yaml.safe_load(cfg)["data"]["dataset"] == "ds-v003"
    # moto completes training jobs at once
    assert be.status(job) == "done"
    with pytest.raises(CloudError, match="--image"):
        SageMakerBackend(owner="alice").submit(run_spec())


def test_sagemaker_cancel_stops_the_job(ready, monkeypatch):
    from botocore.stub import Stubber

    sm = cloud.aws_client(ready, "sagemaker")
    stub = Stubber(sm)
    stub.add_response("stop_training_job", {}, {"TrainingJobName": "qm-r1-261002-081500"})
    real = cloud.aws_client
    monkeypatch.setattr(
        cloud, "aws_client", lambda s, svc, **kw: sm if svc == "sagemaker" else real(s, svc, **kw)
    )
    with stub:
        SageMakerBackend(session=ready).cancel(
            {"training_job": "qm-r1-261002-081500", "region": "us-east-1"}
        )
        stub.assert_no_pending_responses()


def test_sagemaker_container_entry_runs_the_notebook(tmp_path, monkeypatch):
    sm = tmp_path / "ml"
    (sm / "input/config").mkdir(parents=True)
    (sm / "input/data/config").mkdir(parents=True)
    (sm / "input/data/data").mkdir(parents=True)
    (sm / "input/data/data/manifest.json").write_text("{}")
    run = run_spec("r1")
    (sm / "input/data/config/config.yaml").write_text(yaml.safe_dump(run.config))
    (sm / "input/config/hyperparameters.json").write_text(
        json.dumps({"run_name": "r1", "notebook": "nb.ipynb", "dataset": "ds-v003"})
    )
    cells = [
        {
            "cell_type": "code",
            "id": "p",
            "metadata": {"tags": ["parameters"]},
            "outputs": [],
            "execution_count": None,
            "source": "config = ''\noverrides = []\nseed = 0\nrun_name = ''",
        },
        {
            "cell_type": "code",
            "id": "w",
            "metadata": {},
            "outputs": [],
            "execution_count": None,
            "source": "import os, pathlib, yaml\n"
            "cfg = yaml.safe_load(open(config))\n"
            "ds = pathlib.Path(os.environ['QMIND_CACHE']) / cfg['data']['dataset']\n"
            "pathlib.Path('runs', run_name, 'seen.txt').write_text(f\"{seed} {(ds / "
            "'manifest.json').exists()}\")",
        },
    ]
    work = tmp_path / "work"
    work.mkdir()
    (work / "nb.ipynb").write_text(
        json.dumps(
            {
                "cells": cells,
                "metadata": {
                    "kernelspec": {
                        "name": "python3",
                        "display_name": "python3",
                        "language": "python",
                    }
                },
                "nbformat": 4,
                "nbformat_minor": 5,
            }
        )
    )
    monkeypatch.chdir(work)
    monkeypatch.setenv("SM_ROOT", str(sm))
    assert cloud_cli.aws_main(["sagemaker-train"]) == 0
    # the run dir is the checkpoint dir; data is cached
    assert (sm / "checkpoints/seen.txt").read_text() == "1 True"
    assert json.loads((sm / "checkpoints/status.json").read_text())["exit_code"] == 0
    assert (sm / "checkpoints/nb.ipynb").is_file()


# --- Batch: dataset generation -------------------------------------------------------------------


@pytest.fixture
def batch_queue(aws):
    iam, ec2, batch = boto3.client("iam"), boto3.client("ec2"), boto3.client("batch")
    role = iam.create_role(RoleName="batch-service", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    sub = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    sg = ec2.describe_security_groups()["SecurityGroups"][0]["GroupId"]
    ce = batch.create_compute_environment(
        computeEnvironmentName="cpu",
        type="MANAGED",
        state="ENABLED",
        serviceRole=role,
        computeResources={
            "type": "FARGATE",
            "maxvCpus": 16,
            "subnets": [sub],
            "securityGroupIds": [sg],
        },
    )
    batch.create_job_queue(
        jobQueueName="qmind-cpu",
        state="ENABLED",
        priority=1,
        computeEnvironmentOrder=[{"order": 1, "computeEnvironment": ce["computeEnvironmentArn"]}],
    )
    return "qmind-cpu"


def test_batch_array_job_then_dependent_commit(store, batch_queue):
    data = {
        "dataset": "ds-v005",
        "store": STORE,
        "seed_start": 0,
        "episodes": 6,
        "frames_per_episode": 4,
        "shard_size": 8,
        "holdout": "random_15",
    }
    bj = cloud_batch.BatchDataJobs(
        batch_queue,
        image="123456789012.dkr.ecr.us-east-1.amazonaws.com/qmind-render:abc",
        owner="alice",
    )
    rec = bj.submit(data, per_index=2)
    batch = boto3.client("batch")
    jobs = {
        j["jobId"]: j
        for j in batch.describe_jobs(jobs=[rec["array_job_id"], rec["commit_job_id"]])["jobs"]
    }
    arr, com = jobs[rec["array_job_id"]], jobs[rec["commit_job_id"]]
    assert arr["arrayProperties"]["size"] == 3 and com["dependsOn"] == [
        {"jobId": rec["array_job_id"]}
    ]
    assert arr["container"]["command"] == ["qmind", "aws", "data-part"]
    assert com["container"]["command"] == ["qmind", "aws", "data-commit"]
    for j in (arr, com):
        assert {
            "owner": "alice",
            "project": "qmind-render",
        }.items() <= batch.list_tags_for_resource(resourceArn=j["jobArn"])["tags"].items()
    assert {"owner": "alice", "project": "qmind-render"}.items() <= batch.list_tags_for_resource(
        resourceArn=rec["job_definition_arn"]
    )["tags"].items()
    env = {e["name"]: e["value"] for e in arr["container"]["environment"]}
    assert json.loads(base64.b64decode(env["QMIND_DATA_JOB"])) == {"data": data, "per_index": 2}
    # moto marks both SUCCEEDED without running them
    assert bj.status(rec) in cloud.JOB_STATES


def test_batch_indices_and_commit_against_s3(store, tmp_path, monkeypatch):
    from qmind_render.data.cache import verify_dataset
    from qmind_render.data.dataset import DatasetError, read_manifest
    from qmind_render.data.stores import open_store

    monkeypatch.setenv("QMIND_CACHE", str(tmp_path / "cache"))
    data = {
        "dataset": "ds-v006",
        "store": STORE,
        "seed_start": 10,
        "episodes": 3,
        "frames_per_episode": 4,
        "shard_size": 4,
        "holdout": "random_15",
    }
    monkeypatch.setenv(
        "QMIND_DATA_JOB",
        base64.b64encode(json.dumps({"data": data, "per_index": 2}).encode()).decode(),
    )
    monkeypatch.setenv("QMIND_WORKERS", "1")
    monkeypatch.setenv("AWS_BATCH_JOB_ARRAY_INDEX", "1")
    # the second index first: order does not matter
    assert cloud_cli.aws_main(["data-part"]) == 0
    with pytest.raises(DatasetError, match=r"array indices \[0\] of 2 have not finished"):
        cloud_cli.aws_main(["data-commit"])
    monkeypatch.setenv("AWS_BATCH_JOB_ARRAY_INDEX", "0")
    assert cloud_cli.aws_main(["data-part"]) == 0
    assert cloud_cli.aws_main(["data-commit", "--store", STORE, "--dataset", "ds-v006"]) == 0
    m = read_manifest(open_store(STORE), "ds-v006")
    assert (m.seeds, [s.file for s in m.shards], m.n_samples) == (
        [10, 13],
        ["shard-00000.npz", "shard-00001.npz", "shard-00002.npz"],
        12,
    )
    assert verify_dataset(open_store(STORE), "ds-v006") == []
    with pytest.raises(CloudError, match="already committed"):
        cloud_batch.BatchDataJobs(
            "q", image="img", owner="alice", session=cloud.aws_session()
        ).submit(data, 2)


# --- money: budgets, cost review, cleanup, quotas ------------------------------------------------


def test_budget_has_25_50_80_alerts_and_tags(aws):
    sent = []
    aws.events.register(
        "provide-client-params.budgets.CreateBudget", lambda params, **kw: sent.append(params)
    )
    st = cloud_guard.ensure_budget(aws, 5000, ["infra@example.org"], owner="alice")
    assert (st["limit_usd"], st["left_usd"]) == (5000.0, 5000.0)
    # again: nothing doubles
    cloud_guard.ensure_budget(aws, 5000, ["infra@example.org"], owner="alice")
    acct = boto3.client("sts").get_caller_identity()["Account"]
    notes = boto3.client("budgets").describe_notifications_for_budget(
        AccountId=acct, BudgetName="qmind-render"
    )["Notifications"]
    assert sorted((n["NotificationType"], n["Threshold"]) for n in notes) == [
        ("ACTUAL", 25.0),
        ("ACTUAL", 50.0),
        ("ACTUAL", 80.0),
        ("FORECASTED", 100.0),
    ]
    assert len(sent) == 1 and {t["Key"]: t["Value"] for t in sent[0]["ResourceTags"]} == {
        "owner": "alice",
        "project": "qmind-render",
    }
    assert sent[0]["Budget"]["CostTypes"]["IncludeCredit"] is False


def test_cost_review_groups_by_owner(aws, aws_env):
    day = lambda d, groups: {
        "TimePeriod": {"Start": d, "End": d},
        "Estimated": False,
        "Groups": [
            {"Keys": [k], "Metrics": {"UnblendedCost": {"Amount": str(v), "Unit": "USD"}}}
            for k, v in groups
        ],
    }
    _post(
        f"{aws_env}/moto-api/static/ce/cost-and-usage-results",
        {
            "results": [
                {
                    "ResultsByTime": [
                        day("2026-10-05", [("owner$alice", 19.3), ("owner$", 1.86)]),
                        day("2026-10-06", [("owner$bob", 55.04)]),
                    ]
                }
            ]
        },
    )
    rows = cloud_guard.cost_review(aws, days=7)
    assert rows == [("bob", 55.04), ("alice", 19.3), ("(no owner tag)", 1.86)]


def test_cleanup_touches_only_old_unkept_project_orphans(aws, store, capsys):
    ec2, s3, ami = boto3.client("ec2"), boto3.client("s3"), moto_ami()

    def stopped(**tags):
        iid = ec2.run_instances(
            ImageId=ami,
            InstanceType="g6.xlarge",
            MinCount=1,
            MaxCount=1,
            TagSpecifications=cloud.tag_specs(tags, "instance"),
        )["Instances"][0]["InstanceId"]
        ec2.stop_instances(InstanceIds=[iid])
        return iid

    def state(iid):
        return ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0][
            "State"
        ]["Name"]

    ours = stopped(owner="bob", project="qmind-render")
    # someone else's dev box
    other = stopped(owner="eve", project="other")
    kept = stopped(owner="bob", project="qmind-render", **{"qmind:keep": "true"})
    loose = ec2.create_volume(
        AvailabilityZone="us-east-1a",
        Size=500,
        TagSpecifications=cloud.tag_specs({"owner": "carol", "project": "qmind-render"}, "volume"),
    )["VolumeId"]
    untagged = ec2.create_volume(AvailabilityZone="us-east-1a", Size=100)["VolumeId"]
    key = "main/runs/r1/checkpoints/0001000.pt"
    # moto dates it 2010
    s3.create_multipart_upload(Bucket="qmind-lab", Key=key)
    s3.put_bucket_tagging(
        Bucket="qmind-lab", Tagging={"TagSet": cloud.tag_list({"project": "qmind-render"})}
    )
    s3.create_bucket(Bucket="other-lab")
    # not a project bucket
    s3.create_multipart_upload(Bucket="other-lab", Key="big.bin")
    # now: everything but the upload is younger than the default 24 h
    found = {o.id: o for o in cloud_guard.find_orphans(aws)}
    # never another project's
    assert set(found) == {ours, kept, loose, f"s3://qmind-lab/{key}"}
    assert (found[ours].leave, found[kept].leave) == ("younger than 24h", "kept (qmind:keep=true)")
    assert found[f"s3://qmind-lab/{key}"].leave == "" and found[f"s3://qmind-lab/{key}"].age_h > 24
    done = cloud_guard.delete_orphans(aws, list(found.values()), confirm=True)
    assert [line.split(" (")[0] for line in done] == [f"aborted upload s3://qmind-lab/{key}"]
    assert (
        "Uploads" not in s3.list_multipart_uploads(Bucket="qmind-lab") and state(ours) == "stopped"
    )
    assert [u["Key"] for u in s3.list_multipart_uploads(Bucket="other-lab")["Uploads"]] == [
        "big.bin"
    ]
    # three hours on, a 2 h threshold takes ours, and only ours
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=3)
    assert {
        o.id
        for o in cloud_guard.find_orphans(aws, now=later, older_than=dt.timedelta(hours=2))
        if not o.leave
    } == {ours, loose}
    # the command: a dry run changes nothing; --confirm does what it printed
    assert cloud_cli.aws_main(["cleanup", "--older-than", "0"]) == 0
    out = capsys.readouterr().out
    assert (
        "DRY RUN" in out
        and f"would terminate instance {ours}" in out
        and f"would delete volume {loose}" in out
    )
    assert (
        "leave: kept (qmind:keep=true)" in out
        and other not in out
        and untagged not in out
        and state(ours) == "stopped"
    )
    assert cloud_cli.aws_main(["cleanup", "--older-than", "0", "--confirm"]) == 0
    out = capsys.readouterr().out
    assert (
        f"terminated instance {ours}" in out
        and f"deleted volume {loose}" in out
        and "DRY RUN" not in out
    )
    assert (state(ours), state(other), state(kept)) == ("terminated", "stopped", "stopped")
    vols = {v["VolumeId"] for v in ec2.describe_volumes()["Volumes"]}
    assert untagged in vols and loose not in vols


def test_cleanup_counts_a_stopped_instance_from_when_it_stopped(aws):
    """A dev box launched a while ago and stopped a moment ago is young: its age comes from the stop
    (EC2's StateTransitionReason)."""
    ec2 = boto3.client("ec2")
    iid = ec2.run_instances(
        ImageId=moto_ami(),
        InstanceType="g6.xlarge",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=cloud.tag_specs({"owner": "erin", "project": "qmind-render"}, "instance"),
    )["Instances"][0]["InstanceId"]
    # moto dates both with the wall clock, to the second
    time.sleep(2.2)
    ec2.stop_instances(InstanceIds=[iid])
    inst = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
    assert inst["StateTransitionReason"].startswith("User initiated (")
    stopped = cloud_guard.stopped_at(inst)
    assert dt.timedelta(seconds=1.2) <= stopped - inst["LaunchTime"] <= dt.timedelta(seconds=3), (
        stopped,
        inst["LaunchTime"],
    )
    # launched 3.5 s ago, stopped at most 2.3 s ago
    now = inst["LaunchTime"] + dt.timedelta(seconds=3.5)
    [o] = cloud_guard.find_orphans(aws, now=now, older_than=dt.timedelta(seconds=3))
    assert (o.id, o.leave) == (iid, "younger than 3s")
    assert [
        o.leave for o in cloud_guard.find_orphans(aws, now=stopped + dt.timedelta(seconds=3))
    ] == ["younger than 24h"]
    # a day stopped: goes
    assert [
        o.leave for o in cloud_guard.find_orphans(aws, now=stopped + dt.timedelta(hours=25))
    ] == [""]


class FakeQuotas(BaseHTTPRequestHandler):
    """Service Quotas (JSON 1.1 protocol) for EC2's vCPU quotas; throttles the first `throttle`
    requests."""

    limits = {"L-DB2E81BA": 8.0, "L-3819A6DF": 0.0}
    throttle, seen = 0, []

    def log_message(self, *a):
        pass

    def do_POST(self):
        cls, op = type(self), self.headers["X-Amz-Target"].split(".")[-1]
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        cls.seen.append((op, body))
        if cls.throttle > 0:
            cls.throttle -= 1
            return self._send(400, {"__type": "ThrottlingException", "message": "Rate exceeded"})
        code = body.get("QuotaCode")
        if op == "GetServiceQuota":
            if code not in cls.limits:
                return self._send(
                    400, {"__type": "NoSuchResourceException", "message": "no such quota"}
                )
            return self._send(
                200, {"Quota": {"ServiceCode": "ec2", "QuotaCode": code, "Value": cls.limits[code]}}
            )
        if op == "GetAWSDefaultServiceQuota":
            return self._send(
                200, {"Quota": {"ServiceCode": "ec2", "QuotaCode": code, "Value": 0.0}}
            )
        if op == "RequestServiceQuotaIncrease":
            return self._send(
                200,
                {
                    "RequestedQuota": {
                        "Id": "req-1",
                        "Status": "PENDING",
                        "QuotaCode": code,
                        "DesiredValue": body["DesiredValue"],
                    }
                },
            )
        self._send(400, {"__type": "InvalidParameterValue", "message": op})

    def _send(self, code, obj):
        b = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)


@pytest.fixture
def quotas(aws, monkeypatch):
    FakeQuotas.throttle, FakeQuotas.seen = 0, []
    srv = Server(FakeQuotas)
    monkeypatch.setenv("AWS_ENDPOINT_URL_SERVICE_QUOTAS", srv.url)
    yield FakeQuotas
    srv.close()


def test_quota_check_counts_running_vcpus_and_requests_the_shortfall(aws, quotas):
    boto3.client("ec2").run_instances(
        ImageId=moto_ami(), InstanceType="g6e.xlarge", MinCount=1, MaxCount=1
    )
    rows = cloud_guard.quota_report(
        aws, cloud_guard.vcpus_needed([("g6e.xlarge", 2, "on-demand"), ("p5.4xlarge", 1, "spot")])
    )
    by = {(r["family"], r["market"]): r for r in rows}
    assert (
        by["G", "on-demand"]["limit"],
        by["G", "on-demand"]["in_use"],
        by["G", "on-demand"]["short"],
    ) == (8.0, 4, 4)
    # unknown here: AWS's default
    assert (by["P", "spot"]["limit"], by["P", "spot"]["short"]) == (0.0, 16)
    assert cloud_guard.request_increase(aws, "P", "spot", 16, dry_run=True)["dry_run"]
    assert not any(op == "RequestServiceQuotaIncrease" for op, _ in quotas.seen)
    r = cloud_guard.request_increase(aws, "P", "spot", 16)
    assert (r["status"], r["code"]) == ("PENDING", "L-7212CCBC")
    assert (
        "RequestServiceQuotaIncrease",
        {"ServiceCode": "ec2", "QuotaCode": "L-7212CCBC", "DesiredValue": 16.0},
    ) in quotas.seen


def test_throttled_calls_are_retried_with_backoff_then_explained(aws, quotas, monkeypatch):
    quotas.throttle = 2
    t = time.monotonic()
    rows = cloud_guard.quota_report(aws, {("G", "on-demand"): 4})
    # two throttled, then served
    assert rows[0]["limit"] == 8.0 and len(quotas.seen) == 3
    assert time.monotonic() - t < 20
    quotas.throttle, quotas.seen = 10, []
    monkeypatch.setenv("QMIND_AWS_MAX_ATTEMPTS", "2")
    with pytest.raises(
        CloudError, match=r"throttled by AWS \(ThrottlingException\) after 2 attempts"
    ):
        cloud_guard.quota_report(aws, {("G", "on-demand"): 4})
    assert len(quotas.seen) == 2


# --- setup, infra, CLI ---------------------------------------------------------------------------


def test_setup_creates_tagged_bucket_roles_and_instance_profile(aws):
    assert all(
        l.startswith("would")
        for l in cloud.setup(
            aws, "s3://qmind-new/main", owner="alice", create_bucket=True, dry_run=True
        )
    )
    assert "qmind-new" not in [b["Name"] for b in boto3.client("s3").list_buckets()["Buckets"]]
    cloud.setup(aws, "s3://qmind-new/main", owner="alice", create_bucket=True)
    tags = {
        t["Key"]: t["Value"]
        for t in boto3.client("s3").get_bucket_tagging(Bucket="qmind-new")["TagSet"]
    }
    assert tags == {"owner": "alice", "project": "qmind-render"}
    iam = boto3.client("iam")
    for role, (name, _) in cloud.ROLES.items():
        assert {"owner": "alice", "project": "qmind-render"}.items() <= {
            t["Key"]: t["Value"] for t in iam.list_role_tags(RoleName=name)["Tags"]
        }.items()
        doc = iam.get_role_policy(RoleName=name, PolicyName=f"qmind-render-{role}")[
            "PolicyDocument"
        ]
        doc = json.loads(doc) if isinstance(doc, str) else doc
        assert doc == cloud.iam_policy(role, "qmind-new", "main", "us-east-1", "123456789012")
    prof = iam.get_instance_profile(InstanceProfileName="qmind-render-job")["InstanceProfile"]
    assert [r["RoleName"] for r in prof["Roles"]] == ["qmind-render-job"]
    doc = iam.get_role_policy(
        RoleName="qmind-render-sagemaker", PolicyName="qmind-render-sagemaker"
    )["PolicyDocument"]
    doc = json.loads(doc) if isinstance(doc, str) else doc
    grants = [
        st
        for st in doc["Statement"]
        if "cloudwatch:PutMetricData"
        in ([st["Action"]] if isinstance(st["Action"], str) else st["Action"])
    ]
    # AWS lists it for training jobs
    assert [
        {k: st.get(k) for k in ("Effect", "Action", "Resource", "Condition")} for st in grants
    ] == [
        # it has no resource-level form
        {
            "Effect": "Allow",
            "Action": "cloudwatch:PutMetricData",
            "Resource": "*",
            # so: SageMaker's namespaces only
            "Condition": {"StringLike": {"cloudwatch:namespace": "/aws/sagemaker/*"}},
        }
    ]
    rules = boto3.client("s3").get_bucket_lifecycle_configuration(Bucket="qmind-new")["Rules"]
    assert [(r["Filter"], r["AbortIncompleteMultipartUpload"]) for r in rules] == [
        ({"Prefix": "main/"}, {"DaysAfterInitiation": 2})
    ]
    # idempotent
    cloud.setup(aws, "s3://qmind-new/main", owner="alice")
    assert (
        boto3.client("s3").get_bucket_lifecycle_configuration(Bucket="qmind-new")["Rules"] == rules
    )


def test_setup_adds_the_abort_rule_beside_existing_lifecycle_rules(aws):
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="qmind-old")
    logs = {
        "ID": "expire-logs",
        "Status": "Enabled",
        "Filter": {"Prefix": "logs/"},
        "Expiration": {"Days": 30},
    }
    s3.put_bucket_lifecycle_configuration(
        Bucket="qmind-old", LifecycleConfiguration={"Rules": [logs]}
    )
    line = cloud.ensure_abort_rule(aws, "qmind-old", "main")
    assert "kept its 1 other rules" in line
    rules = {r["ID"]: r for r in s3.get_bucket_lifecycle_configuration(Bucket="qmind-old")["Rules"]}
    # merged, not overwritten
    assert rules["expire-logs"] == logs
    assert rules["qmind-render-abort-unfinished-uploads-main"][
        "AbortIncompleteMultipartUpload"
    ] == {"DaysAfterInitiation": 2}
    assert "already aborts" in cloud.ensure_abort_rule(aws, "qmind-old", "main")


def test_infra_files_match_the_code():
    for role in cloud.ROLES:
        assert json.loads((ROOT / f"infra/iam/{role}-policy.json").read_text()) == cloud.iam_policy(
            role
        )
        assert json.loads(
            (ROOT / f"infra/iam/{role}-trust.json").read_text()
        ) == cloud.trust_policy(role)
    # Python 3.11+
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    lock = {
        canonicalize_name(l.split("==")[0])
        for l in (ROOT / "infra/requirements.lock").read_text().splitlines()
        if "==" in l
    }
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert {canonicalize_name(Requirement(d).name) for d in deps} <= lock
    # papermill needs a kernel
    assert "ipykernel" in lock
    docker = (ROOT / "infra/Dockerfile").read_text()
    assert "requirements.lock" in docker and "qmind aws sagemaker-train" in docker


def test_cli_help_and_dry_runs(capsys):
    with pytest.raises(SystemExit):
        cloud_cli.aws_main(["--help"])
    out = capsys.readouterr().out
    for action in (
        "launch",
        "status",
        "cancel",
        "ls",
        "budget",
        "cost-review",
        "cleanup",
        "quota",
        "setup",
        "data",
    ):
        assert action in out
    assert (
        cloud_cli.aws_main(
            [
                "launch",
                f"data.store={STORE}",
                "--backend",
                "sagemaker",
                "--owner",
                "alice",
                "--dry-run",
            ]
        )
        == 0
    )
    assert "would create  training-job" in capsys.readouterr().out
    assert (
        cloud_cli.aws_main(
            ["data", f"data.store={STORE}", "data.episodes=100", "--queue", "q", "--dry-run"]
        )
        == 0
    )
    assert '"indices": 1' in capsys.readouterr().out


def test_foreseeable_cloud_failures_are_one_line_and_exit_2(ready, monkeypatch, capsys, tmp_path):
    from qmind_render.cli import main

    def one_line(argv, *expect):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        for e in expect:
            assert e in err, err

    one_line(
        ["aws", "setup", "s3://no-such-bucket/main", "--owner", "alice"],
        "qmind aws setup: error:",
        "NoSuchBucket",
        "--create-bucket",
    )
    launch = [
        "aws",
        "launch",
        f"data.store={STORE}",
        "data.dataset=ds-v003",
        "--owner",
        "alice",
        "--image-id",
        moto_ami(),
    ]
    # $5,000 left
    one_line(
        [*launch, "--max-hours", "48", "--instance", "p6-b200.48xlarge", "--estimate", "9.5"],
        "qmind aws launch: error: refusing run",
        "may cost up to $5,468.64 ($113.93/h × 48 h); the planner estimates $9.50",
    )
    monkeypatch.setattr(cloud_jobs, "stage_code", lambda *a, **kw: f"{STORE}/code/test.tar.gz")

    class NoQuota(_PendingForever):
        def run_instances(self, **kw):
            raise ClientError(
                {
                    "Error": {
                        "Code": "VcpuLimitExceeded",
                        "Message": "You have requested more vCPU capacity "
                        "than your current vCPU limit of 0",
                    }
                },
                "RunInstances",
            )

    real = cloud.aws_client
    monkeypatch.setattr(
        cloud,
        "aws_client",
        lambda s, svc, **kw: NoQuota(real(s, svc, **kw)) if svc == "ec2" else real(s, svc, **kw),
    )
    one_line([*launch, "--max-hours", "2"], "VcpuLimitExceeded", "qmind aws quota")
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    one_line(["aws", "cleanup"], "qmind aws cleanup: error: no AWS credentials", "aws sso login")


def test_status_reads_records_from_run_dirs(ready, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cloud, "aws_session", lambda region=None, profile=None: ready)
    job = ec2_backend(owner="alice").submit(run_spec("r9"))
    (tmp_path / "runs/r9").mkdir(parents=True)
    (tmp_path / "runs/r9/job.json").write_text(json.dumps(job))
    assert cloud_cli.aws_main(["status", "r9"]) == 0 and "r9: running" in capsys.readouterr().out
    assert cloud_cli.aws_main(["cancel", "runs/r9"]) == 0
    assert (
        cloud_cli.aws_main(["status", "runs/r9/job.json"]) == 0
        and "r9: failed" in capsys.readouterr().out
    )
    assert (
        cloud_cli.aws_main(["status", "nope"]) == 2
        and "no job record at nope" in capsys.readouterr().err
    )
    assert cloud_cli.aws_main(["ls"]) == 0
