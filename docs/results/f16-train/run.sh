#!/bin/bash
# f16 training quality: the bf16 study's recipe (docs/benchmarks.md "bf16 training: quality"), at f16
T=/tmp/f16t/tessera
cp /work/main/build/client/tessera $T
nice $T train --model tiny --steps 141 --batch 64 --lr 5e-4 --warmup 100 --ema 0.999 --seed 1 \
  --precision f16 --out /tmp/f16t/tiny-f16-141.safetensors --data-dir /tmp/bf16t/q/store \
  --loss-log /tmp/f16t/loss-f16.txt --log-every 50 --json > /tmp/f16t/train-f16-141.json 2> /tmp/f16t/train-f16-141.log
echo "train rc=$?" >> /tmp/f16t/train-f16-141.log
cd /tmp/bf16t/ev
nice $T eval --local ens-warm-b8 --monolith /tmp/bf16t/q/tiny-f32.safetensors,/tmp/bf16t/q/tiny-bf16-141.safetensors,/tmp/f16t/tiny-f16-141.safetensors \
  --classifier classifier.safetensors --policies "monolith monolith2 monolith3" --n 1000 --steps 20 \
  --sampler euler --cfg 2 --precision f32 --json > /tmp/f16t/eval.json 2> /tmp/f16t/eval.log
echo "rc=$?" >> /tmp/f16t/eval.log
