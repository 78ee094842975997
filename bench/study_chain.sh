#!/bin/bash
# The study's chain on the device (docs/study.md, "How a session runs"), started in the
# background by the call that installs the carry:
#   (setsid nohup bash bench/study_chain.sh [TRAIN OPTIONS] > /root/e3l/study/chain.log 2>&1 < /dev/null &)
# unpack the committed packs, put back the weak arms' selection of an earlier session (else
# rank their candidates: `weak`), plan, put back the runs earlier sessions finished
# (committed under data/studies/h200-grok/), decode the shipped drafter as the runs are (in
# the background; once: restored after), train and decode the rest. Every stage resumes.
# Extra arguments go to `train` (e.g. --jobs 2 --only NAME,NAME). Inductor's cache lives
# in /root/e3l/inductor; a cache an earlier session brought back and carried in
# (/root/e3l/data/inductor-cache.tar.gz*: bench/compile_cache.py) is unpacked there first.
# An unfinished run's checkpoint an earlier session brought back and carried in
# (/root/e3l/data/resume-RUN.tar.gz*: bench/run_carry.py) goes into its run folder after
# `plan`, so `train` resumes it. STUDY_STAGE=profile runs `profile` instead of `train` (and
# no reference decode beside it): its arguments are then --only NAME --steps FIRST LAST.
set -u
W=${STUDY_WORK:-/root/e3l/study}
T=${E3L_TARGET:-/root/e3l/target}
cd "$(dirname "$0")/.."
export PYTHONPATH=/root/e3l/site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/root/e3l/inductor}
S="python3 -P bench/study_gpu.py"
if ls /root/e3l/data/inductor-cache.tar.gz* > /dev/null 2>&1; then
  python3 -P bench/compile_cache.py in /root/e3l/data/inductor-cache.tar.gz* \
    || echo "compile cache not unpacked: the runs compile as on a bare machine"
fi
$S unpack --work $W --packs data/studies/h200-grok/packs --target $T \
  && $S restore --work $W --results data/studies/h200-grok \
  && $S weak --work $W --target $T --device cuda --config data/studies/h200-grok/config.json \
  && $S plan --work $W --target $T --config data/studies/h200-grok/config.json \
  && $S restore --work $W --results data/studies/h200-grok \
  && { if ls /root/e3l/data/resume-*.tar.gz* > /dev/null 2>&1; then
         python3 -P bench/run_carry.py in --work $W /root/e3l/data/resume-*.tar.gz* \
           || echo "a carried checkpoint was not unpacked (above): its run starts over"
       fi; true; } \
  && { [ "${STUDY_STAGE:-train}" != train ] || { mkdir -p $W/logs; $S reference --work $W \
         --target $T --device cuda --name shipped \
         --drafter data/drafters/smollm2-135m-instruct-sglang > $W/logs/reference.log 2>&1 & }; } \
  && $S ${STUDY_STAGE:-train} --work $W --device cuda "$@"
echo "chain exited $?"
