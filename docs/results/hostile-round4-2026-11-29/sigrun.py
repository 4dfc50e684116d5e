# sigrun.py OUTDIR SIGNAL WAITPATTERN DELAY -- cmd...   : start cmd in its own process group with default signals,
# wait for WAITPATTERN in stderr, sleep DELAY, send SIGNAL to the group (as a terminal's Ctrl-C does), wait, record rc
import os, signal, subprocess, sys, time
out, sig, pat, delay = sys.argv[1], getattr(signal, sys.argv[2]), sys.argv[3], float(sys.argv[4])
cmd = sys.argv[sys.argv.index('--')+1:]
os.makedirs(out, exist_ok=True)
def pre():
    os.setpgrp()
    for s in (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGPIPE): signal.signal(s, signal.SIG_DFL)
p = subprocess.Popen(cmd, stdout=open(out+'/out','wb'), stderr=open(out+'/err','wb'), preexec_fn=pre)
t0=time.time()
while time.time()-t0 < 120:
    if pat.encode() in open(out+'/err','rb').read(): break
    if p.poll() is not None: break
    time.sleep(0.1)
time.sleep(delay)
ts=time.time()
try: os.killpg(p.pid, sig)
except Exception as e: print('kill failed', e)
try: rc = p.wait(timeout=90)
except subprocess.TimeoutExpired:
    print('STILL RUNNING 90 s after signal'); os.killpg(p.pid, signal.SIGKILL); rc = p.wait()
print('rc', rc, 'exit after signal %.1fs' % (time.time()-ts))
open(out+'/rc','w').write(str(rc))
