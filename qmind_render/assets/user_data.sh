#!/bin/bash
# qmind-render EC2 job. Rendered by qmind_render.sweeps.cloud_jobs.render_user_data from the template
# qmind_render/assets/user_data.sh: every placeholder (a name in capitals between at-signs)
# was replaced by a shell-quoted value.
#
# What it does, in order: schedule a power-off after the maximum runtime (the backstop); install
# the pinned environment (infra/requirements.lock from the code archive); sync the dataset from S3
# to local disk; restore the run dir from S3 (a resumed job finds its checkpoints); run the
# papermill notebook beside the watchdog (spot notice, idle GPU) and a periodic sync; then, on
# success AND on failure, upload the run dir with status.json and the log, and power off. The
# instance is launched with InstanceInitiatedShutdownBehavior=terminate, so power-off terminates
# it: no keys on disk (IAM instance profile), nothing left running.
set -uo pipefail

RUN_NAME=@RUN_NAME@
RUN_URI=@RUN_URI@
DATA_URI=@DATA_URI@
DATASET=@DATASET@
CODE_URI=@CODE_URI@
NOTEBOOK=@NOTEBOOK@
CONFIG_B64=@CONFIG_B64@
PARAMS_B64=@PARAMS_B64@
MAX_MINUTES=@MAX_MINUTES@
SYNC_EVERY_S=@SYNC_EVERY_S@
IDLE_MINUTES=@IDLE_MINUTES@
PYTHON=@PYTHON@
export AWS_DEFAULT_REGION=@REGION@
export WANDB_MODE=@WANDB_MODE@
export QMIND_GIT_COMMIT=@GIT_COMMIT@   # the code archive has no .git: this names the commit it holds

# cloud-init runs this with a clean environment; the QMIND_JOB_* overrides exist for the tests.
ROOT=${QMIND_JOB_ROOT:-/opt/qmind}
LOG=${QMIND_JOB_LOG:-/var/log/qmind-job.log}
SRC=$ROOT/src
RUN_DIR=$SRC/runs/$RUN_NAME
LOCAL=$ROOT
if [ -d /opt/dlami/nvme ]; then LOCAL=/opt/dlami/nvme; fi   # the DLAMI mounts instance-store NVMe here
export QMIND_CACHE=$LOCAL/qmind-cache
exec > >(tee -a "$LOG") 2>&1

step() { echo "[qmind $(date -u +%FT%TZ)] $*"; }

# The backstop: whatever happens below, the machine powers off after MAX_MINUTES.
shutdown -h "+$MAX_MINUTES" "qmind: maximum runtime reached" || true

finish() {
  local rc=$?
  trap - EXIT TERM INT
  set +e
  step "job ended with exit code $rc; uploading the run dir"
  kill $(jobs -p) 2>/dev/null      # the periodic upload and the watchdog
  mkdir -p "$RUN_DIR"
  printf '{"run": "%s", "exit_code": %d}\n' "$RUN_NAME" "$rc" > "$RUN_DIR/status.json"
  aws s3 sync "$RUN_DIR" "$RUN_URI" --only-show-errors
  aws s3 cp "$LOG" "$RUN_URI/job.log" --only-show-errors
  step "powering off (terminates this instance)"
  shutdown -h now "qmind: job finished"
}
trap finish EXIT
trap 'exit 143' TERM INT
set -e

step "install the pinned environment"
if ! command -v "$PYTHON" >/dev/null; then
  apt-get update -q && apt-get install -y -q "$PYTHON" "$PYTHON-venv"
fi
mkdir -p "$SRC"
aws s3 cp "$CODE_URI" - --only-show-errors | tar -xz -C "$SRC"
"$PYTHON" -m venv "$ROOT/venv"
"$ROOT/venv/bin/pip" install --quiet --no-cache-dir -r "$SRC/infra/requirements.lock"
"$ROOT/venv/bin/pip" install --quiet --no-cache-dir --no-deps -e "$SRC"
export PATH=$ROOT/venv/bin:$PATH

step "sync dataset $DATASET to local disk"
aws s3 sync "$DATA_URI" "$QMIND_CACHE/$DATASET" --only-show-errors --exclude "parts/*"

step "restore the run dir (a resumed job finds its checkpoints)"
mkdir -p "$RUN_DIR"
aws s3 sync "$RUN_URI" "$RUN_DIR" --only-show-errors
rm -f "$RUN_DIR/status.json"
echo "$CONFIG_B64" | base64 -d > "$RUN_DIR/config.yaml"
echo "$PARAMS_B64" | base64 -d > "$RUN_DIR/params.yaml"

# Upload the run dir every SYNC_EVERY_S while the job runs: a hard stop loses at most that much.
periodic_upload() {
  trap 'kill "$nap" 2>/dev/null; exit 0' TERM
  while :; do
    sleep "$SYNC_EVERY_S" & nap=$!; wait "$nap"
    aws s3 sync "$RUN_DIR" "$RUN_URI" --only-show-errors || true
  done
}

step "run $NOTEBOOK"
periodic_upload >>"$LOG" 2>&1 &
cd "$SRC"
papermill "$NOTEBOOK" "$RUN_DIR/$(basename "$NOTEBOOK")" -f "$RUN_DIR/params.yaml" --cwd "$SRC" &
JOB=$!
"$PYTHON" "$SRC/qmind_render/assets/watchdog.py" --pid "$JOB" --idle-minutes "$IDLE_MINUTES" \
  --marker "$RUN_DIR/watchdog.json" >>"$LOG" 2>&1 &
wait "$JOB"
