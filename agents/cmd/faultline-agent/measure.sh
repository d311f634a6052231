#!/bin/sh
# Measure the agent polling the 34-device synthetic tree every second
# (see agents/README.md). Usage: measure.sh [DIR] [SECONDS]; first
#   go build -o /tmp/faultline-agent ./agents/cmd/faultline-agent
#   go test ./agents/nic -run TestWriteSynthTree -count=1 -args -write-tree=DIR && echo tok > DIR/token
set -e
D=${1:-/tmp/synth}; SECS=${2:-60}
rm -rf $D/spool $D/state.json
NODE_NAME=bench /tmp/faultline-agent run --sysfs $D/sys --metadata-path $D/gpu_metadata.json \
  --boot-id-path $D/boot_id --proc-net-route $D/route --state-file $D/state.json \
  --spool.dir $D/spool --gateway.token-file $D/token --gateway.addr 127.0.0.1:1 --metrics-addr 127.0.0.1:0 \
  --nic.state-polling-interval 1s 2>$D/agent.log &
PID=$!
sleep 5
HZ=$(getconf CLK_TCK)
t0=$(awk '{print $14+$15}' /proc/$PID/stat); s0=$(date +%s.%N)
maxrss=0
i=0
while [ $i -lt $SECS ]; do
  sleep 1; i=$((i+1))
  rss=$(awk '/VmRSS/{print $2}' /proc/$PID/status)
  [ $rss -gt $maxrss ] && maxrss=$rss
done
t1=$(awk '{print $14+$15}' /proc/$PID/stat); s1=$(date +%s.%N)
kill $PID; wait $PID 2>/dev/null || true
echo "ticks=$((t1-t0)) hz=$HZ wall=$(echo "$s1 - $s0" | bc) cpu%=$(echo "scale=3; ($t1-$t0)*100/$HZ/($s1-$s0)" | bc) maxrss_kib=$maxrss"
grep -c '"msg":"event"' $D/agent.log || true
