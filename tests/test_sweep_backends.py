"""`qmind sweep` on the other backends: a real single-node Slurm (Debian's slurm-wlm + munge,
started on loopback for this session; skipped with the reason when they are not installed), and EC2
/ SageMaker against moto_server."""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest

from qmind_render.sweeps import cloud_cli
from qmind_render.cli import main
from qmind_render.sweeps.sweep import SlurmBackend, expand_sweep, job_record, sbatch_script
from qmind_render.sweeps.sweep_cli import sweep_main
from tests.conftest import free_port
from tests.test_cloud import STORE, aws, moto_ami, ready, store, tags_of  # noqa: F401 (fixtures)
from tests.test_sweep import tiny_dir

REPO = Path(__file__).resolve().parents[1]
SLURM_BINARIES = (
    "munged",
    "slurmctld",
    "slurmd",
    "sbatch",
    "squeue",
    "scontrol",
    "scancel",
    "sinfo",
)


# --- the sbatch script (no Slurm needed) ---------------------------------------------------------


def test_sbatch_script_is_one_array_task_per_run(tmp_path):
    runs = expand_sweep(REPO / "sweeps" / "coverage.yaml", root=REPO)
    jobs = [job_record("slurm", r, tmp_path / "runs", REPO) for r in runs]
    s = sbatch_script(
        jobs,
        "coverage",
        {"partition": "gpu", "gpus": 1, "cpus": 8, "time": "4:00:00", "mem": "32G"},
        tmp_path / "logs",
        throttle=3,
        python="/opt/venv/bin/python",
    )
    lines = s.splitlines()
    assert (
        lines[0] == "#!/bin/bash"
        and subprocess.run(["bash", "-n"], input=s, text=True).returncode == 0
    )
    sb = [x for x in lines if x.startswith("#SBATCH")]
    assert sb == [
        "#SBATCH --job-name=qmind-coverage",
        "#SBATCH --array=0-8%3",
        f"#SBATCH --output={tmp_path}/logs/coverage-%A_%a.out",
        "#SBATCH --export=ALL",
        "#SBATCH --partition=gpu",
        "#SBATCH --gres=gpu:1",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --time=4:00:00",
        "#SBATCH --mem=32G",
    ]
    # task i runs run i's notebook with its params.yaml: evaluate the array lines in bash for index
    # 4
    arrays = "\n".join(x for x in lines if x.startswith(("RUNS=", "NOTEBOOKS=")))
    got = subprocess.run(
        ["bash", "-c", arrays + '\nI=4; echo "${RUNS[$I]}|${NOTEBOOKS[$I]}"'],
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert (
        got == f"{tmp_path}/runs/coverage-004-coverage_50-seed2|{REPO}/nbs/experiments/train.ipynb"
    )
    assert (
        lines[-1].startswith("exec /opt/venv/bin/python -m papermill")
        and '-f "$RUN_DIR/params.yaml"' in lines[-1]
    )
    with pytest.raises(ValueError, match="unknown"):
        sbatch_script(jobs, "coverage", {"nodes": 2})


# --- a real Slurm on loopback
# ----------------------------------------------------------------------

SLURM_CONF = """ClusterName=qmindtest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge.socket
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
NodeName=localhost CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """munged + slurmctld + slurmd for this session (one node, 2 CPUs, no cgroups, no accounting);
    yields SLURM_CONF."""
    missing = [b for b in SLURM_BINARIES if shutil.which(b) is None]
    if missing:
        pytest.skip(
            f"Slurm is not installed (missing {', '.join(missing)}): apt-get install -y "
            "slurm-wlm munge"
        )
    if os.geteuid() != 0:
        pytest.skip(
            "a single-node Slurm here runs slurmd as root; run the tests as root to include it"
        )
    d = Path(tmp_path_factory.mktemp("slurm"))
    for sub in ("state", "spool"):
        (d / sub).mkdir()
    (d / "munge.key").write_bytes(os.urandom(1024))
    (d / "munge.key").chmod(0o600)
    conf = d / "slurm.conf"
    conf.write_text(SLURM_CONF.format(d=d, ctld_port=free_port(), slurmd_port=free_port()))
    procs, log = [], open(d / "daemons.out", "w")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_CONF", str(conf))
        try:
            procs.append(
                subprocess.Popen(
                    [
                        "munged",
                        "-F",
                        "--force",
                        "-S",
                        f"{d}/munge.socket",
                        f"--key-file={d}/munge.key",
                        f"--pid-file={d}/munged.pid",
                        f"--log-file={d}/munged.log",
                        f"--seed-file={d}/munge.seed",
                    ],
                    stdout=log,
                    stderr=log,
                )
            )
            deadline = time.monotonic() + 10
            while not (d / "munge.socket").exists():
                assert time.monotonic() < deadline, (
                    f"munged did not start: {(d / 'munged.log').read_text()}"
                )
                time.sleep(0.1)
            procs.append(
                subprocess.Popen(["slurmctld", "-D", "-f", str(conf)], stdout=log, stderr=log)
            )
            procs.append(
                subprocess.Popen(
                    ["slurmd", "-D", "-f", str(conf), "-N", "localhost"], stdout=log, stderr=log
                )
            )
            deadline = time.monotonic() + 60
            while (
                subprocess.run(
                    ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True
                ).stdout.strip()
                != "idle"
            ):
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    logs = {
                        f: (d / f).read_text()[-1500:]
                        for f in ("slurmctld.log", "slurmd.log")
                        if (d / f).exists()
                    }
                    pytest.fail(f"single-node Slurm did not come up: {logs}")
                time.sleep(0.5)
            yield conf
        finally:
            subprocess.run(["scancel", "--user", "root"], capture_output=True)
            for p in reversed(procs):
                p.terminate()
                try:
                    p.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    p.kill()
            log.close()


@pytest.mark.slow
def test_slurm_sweep_runs_a_job_array(slurm_cluster, tmp_path, monkeypatch, capsys):
    sweep = tiny_dir(tmp_path, monkeypatch, "tinyslurm", slurm={"cpus": 1, "time": "0:30:00"})
    monkeypatch.chdir(tmp_path)
    t0 = time.monotonic()
    assert sweep_main([str(sweep), "--backend", "slurm", "--wait", "--poll", "2"]) == 0
    print(f"slurm sweep of 2 tiny runs: {time.monotonic() - t0:.1f} s", file=sys.stderr)
    out = capsys.readouterr().out
    names = ["tinyslurm-000-seed1", "tinyslurm-001-seed2"]
    recs = [json.loads((tmp_path / "runs" / n / "job.json").read_text()) for n in names]
    array = recs[0]["slurm_job_id"].split("_")[0]
    # one array, one task per run
    assert [r["slurm_job_id"] for r in recs] == [f"{array}_0", f"{array}_1"]
    script = Path(recs[0]["script"]).read_text()
    assert (
        "#SBATCH --array=0-1" in script
        and "#SBATCH --cpus-per-task=1" in script
        and "#SBATCH --time=0:30:00" in script
    )
    for n, r in zip(names, recs):
        assert f"{n}: queued  {r['slurm_job_id']}" in out
        log = Path(r["log"]).read_text()
        assert (
            f"qmind: array task {r['slurm_job_id'].split('_')[1]} (job {r['slurm_job_id']})" in log
        )
        rd = tmp_path / "runs" / n
        assert (rd / "train.ipynb").is_file() and (rd / "eval" / "eval.json").is_file()
    table = out[out.index("\nrun ") :].strip().splitlines()
    assert [line.split()[:2] for line in table[1:] if line.startswith("tinyslurm-")] == [
        [n, "done"] for n in names
    ]
    assert SlurmBackend(tmp_path / "runs").status(recs[0]) == "done"
    # the job records answer --status (squeue/scontrol), and a rerun submits nothing
    assert sweep_main([str(sweep), "--status"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        (n, "slurm", rec["slurm_job_id"], "done") for n, rec in zip(names, recs)
    ]
    assert sweep_main([str(sweep), "--backend", "slurm"]) == 0
    assert capsys.readouterr().out.count("(finished earlier, skipped)") == 2
    assert len(list((tmp_path / "runs" / "slurm").glob("*.sbatch"))) == 1


def test_slurm_rerun_leaves_queued_tasks_alone(slurm_cluster, tmp_path, monkeypatch, capsys):
    """With the partition down the task stays PENDING: a rerun sees it in squeue and submits
    nothing; cancel ends it."""
    sweep = tiny_dir(tmp_path, monkeypatch, "held", grid={"seed": [7]})
    monkeypatch.chdir(tmp_path)
    runs = expand_sweep(sweep)
    be = SlurmBackend(tmp_path / "runs", sweep="held")
    subprocess.run(["scontrol", "update", "PartitionName=debug", "State=DOWN"], check=True)
    try:
        (job,) = be.submit_many(runs)
        assert be.status(job) == "queued"
        (again,) = SlurmBackend(tmp_path / "runs", sweep="held").submit_many(runs)
        assert (
            again["skipped"]
            and again["slurm_job_id"] == job["slurm_job_id"]
            and again["state"] == "queued"
        )
        assert len(list((tmp_path / "runs" / "slurm").glob("*.sbatch"))) == 1
        be.cancel(job)
        deadline = time.monotonic() + 30
        # cancelled, and the run dir has no final eval
        while be.status(job) != "failed":
            assert time.monotonic() < deadline
            time.sleep(0.5)
    finally:
        subprocess.run(["scontrol", "update", "PartitionName=debug", "State=UP"], check=True)


# --- EC2 and SageMaker against moto_server
# ---------------------------------------------------------


def cloud_sweep(tmp_path, name="cloudy", steps=None) -> Path:
    ov = [f"data.store={STORE}", "data.dataset=ds-v003"] + (
        [f"train.steps={steps}"] if steps else []
    )
    p = tmp_path / f"{name}.yaml"
    p.write_text(
        json.dumps(
            {
                "name": name,
                "base": str(REPO / "sweeps" / "exp" / "quickstart.yaml"),
                "overrides": ov,
                "grid": {"seed": [1, 2]},
            }
        )
    )
    return p


def live_instances() -> list[dict]:
    r = boto3.client("ec2").describe_instances(
        Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}]
    )
    return [i for res in r["Reservations"] for i in res["Instances"]]


def test_ec2_sweep_launches_one_instance_per_run(ready, tmp_path, capsys):  # noqa: F811 (fixture)
    sweep, runs = cloud_sweep(tmp_path), tmp_path / "runs"
    # the planner's estimate fits in the $5,000, but 2 runs × 48 h at $55.04/h do not: the budget
    # guard refuses the whole sweep up front, as one line through the CLI's error boundary
    big = [
        str(sweep),
        "--backend",
        "ec2",
        "--instance",
        "p5.48xlarge",
        "--max-hours",
        "48",
        "--image-id",
        moto_ami(),
        "--owner",
        "alice",
        "--allow-dirty",
        "--runs",
        str(runs),
    ]
    assert main(["sweep", *big, "--dry-run"]) == 0
    assert (
        "budget guard: charges the cap, $5,283.84 = 2 runs × $55.04/h × 48 h"
        in capsys.readouterr().out
    )
    assert main(["sweep", *big]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert re.search(
        r"^qmind sweep: error: refusing sweep \S*cloudy.yaml \(2 runs\): it may cost up "
        r"to \$5,283.84 "
        r"\(2 runs × \$55.04/h × 48 h\); the planner estimates \$\d+\.\d\d",
        err,
    ), err
    assert live_instances() == []
    args = [
        str(sweep),
        "--backend",
        "ec2",
        "--image-id",
        moto_ami(),
        "--owner",
        "alice",
        "--allow-dirty",
        "--max-hours",
        "4",
        "--runs",
        str(runs),
    ]
    assert sweep_main(args) == 0
    out = capsys.readouterr().out
    insts = {tags_of(i)["run"]: i for i in live_instances()}
    assert set(insts) == {"cloudy-000-seed1", "cloudy-001-seed2"}
    for name, inst in insts.items():
        # the local record `--status` reads
        rec = json.loads((runs / name / "job.json").read_text())
        assert rec["instance_id"] == inst["InstanceId"] and rec["backend"] == "ec2"
        assert inst["InstanceType"] == "g6.xlarge" and inst["InstanceLifecycle"] == "spot"
        # the planner's estimate, beside...
        assert float(tags_of(inst)["qmind:estimate-usd"]) < 4 * 0.805
        # ...the cap the guard counts: 4 h × $0.805
        assert tags_of(inst)["qmind:max-usd"] == "3.22"
        s3rec = (
            boto3.client("s3")
            .get_object(Bucket="qmind-lab", Key=f"main/runs/{name}/job.json")["Body"]
            .read()
        )
        assert json.loads(s3rec)["instance_id"] == inst["InstanceId"]
        assert f"{name}: queued" in out
    assert [line.split()[:2] for line in out[out.index("\nrun ") :].strip().splitlines()[1:]] == [
        ["cloudy-000-seed1", "running"],
        ["cloudy-001-seed2", "running"],
    ]
    # a rerun leaves running jobs alone; --status reads them from the records
    assert sweep_main(args) == 0
    assert (
        capsys.readouterr().out.count("(already submitted, skipped)") == 2
        and len(live_instances()) == 2
    )
    assert sweep_main([str(sweep), "--status", "--runs", str(runs)]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [(r[1], r[2], r[3]) for r in rows] == [
        ("ec2", insts[r[0]]["InstanceId"], "running") for r in rows
    ]
    for i in live_instances():
        boto3.client("ec2").terminate_instances(InstanceIds=[i["InstanceId"]])


def _budget(session, usd):
    "The project's AWS Budget, replaced by one of `usd`."
    from qmind_render.sweeps import cloud_guard

    acct = boto3.client("sts").get_caller_identity()["Account"]
    boto3.client("budgets").delete_budget(AccountId=acct, BudgetName="qmind-render")
    cloud_guard.ensure_budget(session, usd, ["infra@example.org"], owner="alice")


def test_sagemaker_sweep_creates_one_training_job_per_run(ready, tmp_path, capsys):  # noqa: F811 (fixture)
    sweep, runs = cloud_sweep(tmp_path), tmp_path / "runs"
    args = [
        str(sweep),
        "--backend",
        "sagemaker",
        "--image",
        "123456789012.dkr.ecr.us-east-1.amazonaws.com/qmind-render:abc",
        "--role-arn",
        "arn:aws:iam::123456789012:role/qmind-render-sagemaker",
        "--owner",
        "alice",
        "--max-hours",
        "6",
        "--runs",
        str(runs),
    ]
    # over budget, as for EC2: 2 runs × 6 h at $1.41/h do not fit in $10, refused up front in one
    # line, nothing created
    _budget(ready, 10)
    assert main(["sweep", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert re.search(
        r"^qmind sweep: error: refusing sweep \S*cloudy.yaml \(2 runs\): it may cost up to \$16.92 "
        r"\(2 runs × \$1.41/h × 6 h\)\. That exceeds what is left of budget "
        r"'qmind-render': \$10.00",
        err,
    ), err
    assert (
        boto3.client("sagemaker").list_training_jobs()["TrainingJobSummaries"] == []
        and not runs.exists()
    )
    _budget(ready, 5000)
    assert sweep_main(args) == 0
    out = capsys.readouterr().out
    sm = boto3.client("sagemaker")
    for name in ("cloudy-000-seed1", "cloudy-001-seed2"):
        rec = json.loads((runs / name / "job.json").read_text())
        d = sm.describe_training_job(TrainingJobName=rec["training_job"])
        assert (
            d["CheckpointConfig"]["S3Uri"] == f"{STORE}/runs/{name}/"
            and d["EnableManagedSpotTraining"] is True
        )
        assert (
            d["HyperParameters"]["run_name"] == name
            and d["ResourceConfig"]["InstanceType"] == "ml.g5.xlarge"
        )
        cfg = (
            boto3.client("s3")
            .get_object(Bucket="qmind-lab", Key=f"main/runs/{name}/config.yaml")["Body"]
            .read()
        )
        assert f"seed: {name[-1]}" in cfg.decode()
    assert [line.split()[:2] for line in out[out.index("\nrun ") :].strip().splitlines()[1:]] == [
        # moto completes training jobs at once
        ["cloudy-000-seed1", "done"],
        ["cloudy-001-seed2", "done"],
    ]
    n_jobs = len(sm.list_training_jobs()["TrainingJobSummaries"])
    # rerun: both finished, nothing created
    assert sweep_main(args) == 0
    assert len(sm.list_training_jobs()["TrainingJobSummaries"]) == n_jobs
    assert capsys.readouterr().out.count("(finished earlier, skipped)") == 2
    assert cloud_cli.backend_for(rec).status(rec) == "done"
