#!/bin/bash
# What compiling the target's forward does to one online run, on the device, after the
# install (docs/study.md, session 22): the chain up to its plan (STUDY_STAGE=config: the
# run's train config, WORK/configs/bench-NAME.json), then `bench/target_sdpa.py --compiled
# --fp32-reference` on its config (the target's forwards alone, side by side; each
# setting's states against fp32), the run's first steps with the target compiled
# (`target_compile`; `study_gpu.py profile`: the unprofiled rate of the steps before
# FIRST, then FIRST..LAST profiled), then again without the compile, on this machine (the
# most telling first, should the machine go). Each step's output goes to
# the log; after each, WORK/speed.tar.gz holds the small results so far (the profiles'
# summaries, metrics and run.json, the bench's JSON, the logs). Started like the chain:
#   (setsid nohup bash bench/study_speed.sh NAME [FIRST LAST] \
#      > /root/e3l/study/chain.log 2>&1 < /dev/null &)
# and polled with bench/study_poll.sh (it ends on "chain exited"); then
#   cp /root/e3l/study/speed.tar.gz $OUT/
set -u
W=${STUDY_WORK:-/root/e3l/study}
if [ $# -lt 1 ]; then
  echo "usage: study_speed.sh NAME [FIRST LAST] (NAME: a run of the plan)" >&2; exit 2
fi
NAME=$1 FIRST=${2:-300} LAST=${3:-360}
cd "$(dirname "$0")/.."
mkdir -p $W/logs
STUDY_STAGE=config bash bench/study_chain.sh --only $NAME > $W/logs/config.log 2>&1
tail -n 3 $W/logs/config.log
CFG=$W/configs/bench-$NAME.json
if [ ! -f $CFG ]; then
  echo "no $CFG: the chain stopped before it (above)"; echo "chain exited 1"; exit 1
fi
export PYTHONPATH=/root/e3l/site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/root/e3l/inductor}
S="python3 -P bench/study_gpu.py"
pack() {  # the small files only (no checkpoint, no trace), after each step
  (cd $W && find profile logs configs -type f -size -8M -not -name '*.safetensors' \
     -not -name '*.pt' -print0 | tar -czf speed.tar.gz.tmp --null -T - \
     && mv speed.tar.gz.tmp speed.tar.gz)
}
python3 -P bench/target_sdpa.py --config $CFG --steps 60 --compiled --fp32-reference \
  --out $W/logs/target-sdpa.json 2>&1 | tee $W/logs/target-sdpa.log
rc=${PIPESTATUS[0]}
pack
$S profile --work $W --device cuda --only $NAME --steps $FIRST $LAST --set target_compile=true
pack
$S profile --work $W --device cuda --only $NAME --steps $FIRST $LAST
pack
echo "chain exited $rc"
