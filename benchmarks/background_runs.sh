# Sourced by the gpu_parity*.sh scripts: watch benchmark runs that a device command
# started in the background (setsid) and that outlive it.
#   watch_runs PATTERN   wait while a process whose command line holds PATTERN runs, at
#                        most $WAIT s, logging GPU memory / utilisation to $DIR/watch.log

watch_runs() {
  local pattern=$1 start=$SECONDS
  sleep 5  # a launcher shell may not have started its first run yet
  while pgrep -f "$pattern" > /dev/null && [ $((SECONDS - start)) -lt "$WAIT" ]; do
    sleep 20
    command -v nvidia-smi > /dev/null && echo "== $(date +%T) GPU memory, utilisation: \
$(nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader)" \
      >> "$DIR/watch.log"
  done
  if pgrep -f "$pattern" > /dev/null; then echo "still running at $(date +%T)"
  else echo "all runs ended at $(date +%T)"; fi
}
