#!/bin/bash
# One poll of the study's chain on the device (docs/study.md): wait SECONDS, or less (the
# wait ends once the chain's log says "chain exited", so a chain that failed at start or
# finished early costs no more device time); print the chain's log tail and each run's
# newest metrics line, then put the small results (the plan, each run's run.json,
# metrics.jsonl, live.json, and the logs) into ONE file, $OUT/results.tar.gz (the device
# returns at most 8 files, 2 folders deep), with the best final drafter decoded on this
# machine (`collect --winner auto`, ~20 MB for the default target's drafter: session 24's
# best run stayed on the device for want of one); STUDY_WINNER=RUN packs that run's final
# drafter instead once it exists, STUDY_WINNER=none none; a tar over 15 MiB comes back in parts,
# $OUT/results.tar.gz.part00, ... (cat them, then untar). With STUDY_CACHE_OUT=1,
# inductor's cache comes back too ($OUT/inductor-cache.tar.gz*, at most 30 MiB:
# bench/compile_cache.py), for the next session's carry. With STUDY_CARRY_OUT=RUNS (comma-
# separated, or `all`: every unfinished run with a checkpoint), once the chain has exited
# (its deadline stopped a run, `--finish-margin-s -1`), those runs' newest checkpoints come
# back too (`bench/run_carry.py out`, at most STUDY_CARRY_MIB, default 60, less what $OUT
# holds already; call again for parts left), so one launch serves a run that finishes and
# one the session's end stops (session 25 lost its machine before either could start).
#   [STUDY_WINNER=RUN|auto|none] [STUDY_CACHE_OUT=1] [STUDY_CARRY_OUT=RUNS|all]
#   bash bench/study_poll.sh SECONDS
set -u
W=${STUDY_WORK:-/root/e3l/study}
cd "$(dirname "$0")/.."
export PYTHONPATH=/root/e3l/site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/root/e3l/inductor}
case ${1:-60} in
  '' | *[!0-9]*) echo "study_poll.sh: SECONDS must be a whole number, not '$1'" >&2; exit 2 ;;
esac
case ${STUDY_CARRY_MIB:-60} in
  '' | *[!0-9]*) echo "study_poll.sh: STUDY_CARRY_MIB must be a whole number of MiB, not" \
                      "'$STUDY_CARRY_MIB'" >&2; exit 2 ;;
esac
end=$((SECONDS + ${1:-60}))
while [ $SECONDS -lt $end ] && ! grep -q '^chain exited' $W/chain.log 2> /dev/null; do
  sleep 2
done
tail -n 20 $W/chain.log
for f in $W/study/runs/*/metrics.jsonl; do
  [ -f "$f" ] && echo "$(basename $(dirname $f)): $(tail -n 1 $f | cut -c 1-90)"
done
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
echo "inductor cache: $(du -sh $TORCHINDUCTOR_CACHE_DIR 2>/dev/null | cut -f1)"
if [ "${STUDY_CACHE_OUT:-0}" = 1 ]; then
  python3 -P bench/compile_cache.py out --dest "$OUT"
fi
if [ -f $W/study/study.json ]; then
  rm -rf $W/collected
  python3 -P bench/study_gpu.py collect --work $W --dest $W/collected \
      $([ "${STUDY_WINNER:-auto}" = none ] || echo --winner ${STUDY_WINNER:-auto}) \
      | grep winner
  tar -czf $W/results.tar.gz -C $W collected logs
  if [ "$(stat -c %s $W/results.tar.gz)" -le $((15 * 1024 * 1024)) ]; then
    cp $W/results.tar.gz "$OUT/results.tar.gz"
  else
    split -b 15m -d $W/results.tar.gz "$OUT/results.tar.gz.part"
  fi
fi
if [ -n "${STUDY_CARRY_OUT:-}" ]; then
  if ! grep -q '^chain exited' $W/chain.log 2> /dev/null; then
    echo "carry out: not yet, the chain is still running (its checkpoints may change)"
  else
    left=$(( ${STUDY_CARRY_MIB:-60} - $(du -sm "$OUT" | cut -f1) ))
    python3 -P bench/run_carry.py out --work $W --dest "$OUT" --max-mib $(( left > 0 ? left : 0 )) \
        $([ "$STUDY_CARRY_OUT" = all ] || echo --runs "$STUDY_CARRY_OUT")
  fi
fi
