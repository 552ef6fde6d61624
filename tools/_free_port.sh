# Sourced by dist_train.sh / dist_test.sh: set PORT to a free TCP port on this host.
# Keeps $PORT (default 29500) when it is free; otherwise picks a free one and says so.
# On a multi-node job (NNODES > 1) the port must agree across nodes, so it is kept as is.
PORT=${PORT:-29500}
if [ "${NNODES:-1}" -eq 1 ]; then
  _py=${PYTHON:-python}
  _free=$("$_py" - "$PORT" <<'PY'
import socket, sys
want = int(sys.argv[1])
def free(port):
    with socket.socket() as s:
        try:
            s.bind(('', port))
        except OSError:
            return False
        return True
if free(want):
    print(want)
else:
    with socket.socket() as s:
        s.bind(('', 0))
        print(s.getsockname()[1])
PY
)
  if [ "$_free" != "$PORT" ]; then
    echo "[mmdet3d-scaling] port $PORT is taken; using free port $_free (set PORT to choose)" >&2
    PORT=$_free
  fi
fi
