#!/usr/bin/env bash
# bench_ui: keystroke-to-screen latency of the chat screen (a benchmark, not a test).
# Runs kvchat on a pseudo-terminal, types a character and times until kvchat has written it
# to the terminal; idle, while a reply streams, and with 10,000 messages of history
# (KVCHAT_BENCH_HISTORY fills the pane). Also times PgUp/Home/End redraws with that history.
# Usage: tests/bench_ui.sh [MODEL] [SAMPLES]     (from the repository root, after make)
set -eu
BIN=${KVCHAT_BIN:-./kvchat}
MODEL=${1:-${KVCHAT_SHARED:-../shared}/models/stories260K.gguf}
SAMPLES=${2:-200}
exec python3 - "$BIN" "$MODEL" "$SAMPLES" <<'PY'
import fcntl, os, pty, select, statistics, struct, sys, tempfile, termios, time

BIN, MODEL, N = sys.argv[1], sys.argv[2], int(sys.argv[3])
ROWS, COLS = 30, 100
MARK = '§'.encode()

def spawn(history):
    tmp = tempfile.mkdtemp(prefix='kvchat-bench-')
    env = dict(os.environ, LANG='C.UTF-8', TERM='xterm-256color', XDG_STATE_HOME=tmp, XDG_CONFIG_HOME=tmp)
    env.pop('NO_COLOR', None)
    if history: env['KVCHAT_BENCH_HISTORY'] = str(history)
    pid, fd = pty.fork()
    if pid == 0:
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack('HHHH', ROWS, COLS, 0, 0))
        os.execve(BIN, [BIN, '-m', MODEL, '-t', '1', '-c', '8192'], env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack('HHHH', ROWS, COLS, 0, 0))
    return pid, fd

def read_until(fd, needle, timeout):
    buf, end = b'', time.monotonic() + timeout
    while time.monotonic() < end:
        r, _, _ = select.select([fd], [], [], 0.05)
        if r:
            try: chunk = os.read(fd, 65536)
            except OSError: break
            buf += chunk
            if needle in buf: return buf
    raise SystemExit('bench_ui: timed out waiting for %r' % needle)

def read_for(fd, seconds):
    """Read everything for a while; returns the byte count."""
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        r, _, _ = select.select([fd], [], [], 0.05)
        if r:
            try: n += len(os.read(fd, 65536))
            except OSError: break
    return n

def drain(fd, quiet=0.0):
    while True:
        r, _, _ = select.select([fd], [], [], quiet)
        if not r: return
        try: os.read(fd, 65536)
        except OSError: return

def time_echo(fd, n):
    """Type MARK, time until it is written back. Each mark lands in a new cell (erasing it
    could cancel out with the next one before a frame); the line is cleared every 40.
    Returns ms per sample."""
    out = []
    for i in range(n):
        if i % 40 == 0:
            os.write(fd, b'\x15')  # Ctrl-U
            time.sleep(0.1)
        drain(fd)
        t0 = time.monotonic()
        os.write(fd, MARK)
        buf, seen = b'', False
        while not seen:
            r, _, _ = select.select([fd], [], [], 2.0)
            if not r: raise SystemExit('bench_ui: no echo within 2 s')
            buf += os.read(fd, 65536)
            seen = MARK in buf
        out.append((time.monotonic() - t0) * 1e3)
        time.sleep(0.01)
    os.write(fd, b'\x15')
    time.sleep(0.1)
    return out

def time_key(fd, key, n):
    """Time from a key to the first bytes of the redraw (an idle screen)."""
    out = []
    for _ in range(n):
        drain(fd, 0.02)
        t0 = time.monotonic()
        os.write(fd, key)
        r, _, _ = select.select([fd], [], [], 2.0)
        if not r: raise SystemExit('bench_ui: no redraw within 2 s')
        os.read(fd, 65536)
        out.append((time.monotonic() - t0) * 1e3)
    return out

def report(name, ms):
    ms = sorted(ms)
    p = lambda q: ms[min(len(ms) - 1, int(q * len(ms)))]
    print('%-44s n=%-4d p50 %6.2f ms  p95 %6.2f ms  p99 %6.2f ms  max %6.2f ms' % (name, len(ms), p(0.5), p(0.95), p(0.99), ms[-1]))

def stop(pid, fd):
    os.write(fd, b'\x04')
    try: os.waitpid(pid, 0)
    except ChildProcessError: pass

for history in (0, 10000):
    label = 'with %d messages of history' % history if history else 'empty history'
    t_start = time.monotonic()
    pid, fd = spawn(history)
    read_until(fd, b'ready', 60)
    if history: print('startup with %d messages: %.0f ms' % (history, (time.monotonic() - t_start) * 1e3))
    report('type a key, idle, ' + label, time_echo(fd, N))
    if history:
        report('PgUp redraw, ' + label, time_key(fd, b'\x1b[5~', 50))
        jumps = []
        for _ in range(20): jumps += time_key(fd, b'\x1bOH', 1) + time_key(fd, b'\x1bOF', 1)
        report('Home / End (top <-> bottom) redraw, ' + label, jumps)
    os.write(fd, b'Once upon a time\r')
    n = read_for(fd, 1.0)  # the reply streams (-c 8192: for tens of seconds)
    if n < 10000: raise SystemExit('bench_ui: the reply does not stream (%d bytes in 1 s)' % n)
    t0 = time.monotonic()
    echo = time_echo(fd, N)
    busy = read_for(fd, 0.3)
    if busy < 1000: raise SystemExit('bench_ui: the reply ended during the measurement; use fewer samples')
    report('type a key while a reply streams, ' + label, echo)
    print('  (%.1f s of streaming; the screen got %d bytes in the 0.3 s after)' % (time.monotonic() - t0, busy))
    os.write(fd, b'\x1b')
    drain(fd, 0.5)
    stop(pid, fd)
PY
