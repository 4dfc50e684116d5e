import os, subprocess, sys
r, w = os.pipe(); os.close(r)
p = subprocess.run(sys.argv[1:], stdout=w, stderr=subprocess.PIPE, timeout=60)
os.close(w)
print('rc', p.returncode, '| stderr:', p.stderr[:300])
