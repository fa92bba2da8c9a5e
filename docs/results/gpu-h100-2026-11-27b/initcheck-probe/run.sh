#!/bin/bash
L=$(dirname "$(find /usr/local/cuda/ /usr/local /opt -name 'libcublas.so.13*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$L:/usr/local/cuda/lib64
CS=/usr/local/cuda/bin/compute-sanitizer
$CS --version | tail -1
for s in "512 384 128" "392 256 64" "4096 1024 1024"; do
  echo "== probe $s"
  timeout 60 $CS --tool initcheck --print-limit 100000 .probe/probe $s >$OUT/probe.log 2>&1
  grep -o "at k_read_after_[a-z0-9]*" $OUT/probe.log | sort | uniq -c; grep "probe M\|ERROR SUMMARY" $OUT/probe.log
done
mkdir -p /tmp/b && tar -xJf .gpu/bundle.tar.xz -C /tmp/b
export LD_LIBRARY_PATH=/tmp/b/lib:$L:/usr/local/cuda/lib64
echo "== test_cuda_dit under initcheck, every report's kernel and test"
timeout 230 $CS --tool initcheck --print-limit 0 /tmp/b/build/tests/test_cuda_dit 2>&1 | awk '
/^\[ RUN|^\[       OK|ERROR SUMMARY/ {print > "/dev/stderr"; next}
/=========     at / {k=$3; f=""; next}
/Host Frame: ts_/ && f=="" {f=$4; next}
/Host Frame: (test_|train_both|forward_)/ {if (k!="") {c[k" <- "f" <- "$4]++; k=""}}
END {for (x in c) print c[x], x}' | sort -rn | head -60
