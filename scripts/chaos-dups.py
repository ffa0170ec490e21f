#!/usr/bin/env python3
# scripts/chaos-dups.py DIR: attributes an at-least-once chaos run's two-hop
# over-count (docs/chaos.md, run I). DIR is the run's directory (the
# harness prints "worker logs in DIR"); the run must have been made with
# RUNNEL_CHAOS_LOG_LEVEL=debug, so that the workers' logs name the offsets
# each commit carried. For every run of input offsets in
# DIR/dups-<repartition topic>.txt (written by the verifier) it finds the
# commit the run started from, the member that made it, and what ended that
# member's work on the partition next: its exit (kill -9, SIGTERM), a final
# cycle that did not complete, or an abandoned task. It prints one line per
# run and the events sent again per cause.
import sys, re, glob, os, datetime as dt
d=sys.argv[1]
def ts(s):
    s=s.rstrip('Z'); a,b=s.split('.'); return dt.datetime.fromisoformat(a+'.'+b[:6])
events=[]  # (time, worker, kind, text)
commits={} # (p,off) -> list of (time, worker)
for f in sorted(glob.glob(os.path.join(d,'w*/worker.log'))):
    w=f.split('/')[-2]
    for line in open(f,errors='replace'):
        m=re.match(r'=== chaos: \S+ \(pid \d+\) exited at (\S+): (.*)',line)
        if m: events.append((ts(m.group(1)),w,'exit',m.group(2).strip())); continue
        m=re.match(r'=== chaos: start \S+ at (\S+)',line)
        if m: events.append((ts(m.group(1)),w,'start','')); continue
        m=re.search(r'time=(\S+)',line)
        if not m: continue
        t=ts(m.group(1))
        if 'msg="offsets committed"' in line and 'err=<nil>' in line:
            for p,off in re.findall(r'change-events\[(\d+)\]@(\d+)',line):
                commits.setdefault((int(p),int(off)),[]).append((t,w))
        elif 'final commit cycle did not complete' in line:
            events.append((t,w,'final-failed',line[line.find('topic='):][:120]))
        elif 'to=abandoned' in line:
            events.append((t,w,'abandoned',line[line.find('task='):][:60]))
        elif 'msg=assignment' in line:
            events.append((t,w,'assignment',re.search(r'actives="([^"]*)"',line).group(1).split(' ')[0][-12:] if 'actives="' in line else ''))
events.sort()
runs=[l.split() for l in open(glob.glob(os.path.join(d,'dups-*.txt'))[0]) if not l.startswith('#')]
tot=0; causes={}
for p,first,last,n in runs:
    p,first,last,n=int(p),int(first),int(last),int(n); tot+=n
    c=commits.get((p,first))
    if not c:
        # nearest commit at or below first
        cands=[(off,v) for (pp,off),v in commits.items() if pp==p and off<=first]
        if cands:
            off,v=max(cands); c=v; note=f'(nearest commit @{off})'
        else:
            print(p,first,last,n,'no commit found (start of partition?)'); causes['nocommit']=causes.get('nocommit',0)+n; continue
    else: note=''
    t,w=max(c)
    nxt=[e for e in events if e[1]==w and e[0]>t and e[2] in ('exit','final-failed','abandoned')]
    e=nxt[0] if nxt else None
    kind = (e[2]+':'+e[3][:14]) if e else 'none'
    if e and e[2]=='exit': kind='exit:'+('kill' if 'killed' in e[3] else e[3])
    causes[kind]=causes.get(kind,0)+n
    print(p,first,last,n,'last commit by',w,t.strftime('%H:%M:%S.%f')[:-3],note,'->',kind, e[0].strftime('%H:%M:%S.%f')[:-3] if e else '', round((e[0]-t).total_seconds(),2) if e else '')
print('total dup events',tot)
for k,v in sorted(causes.items(),key=lambda x:-x[1]): print(k,v)
