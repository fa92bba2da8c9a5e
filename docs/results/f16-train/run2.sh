#!/bin/bash
# the same comparison at a second training seed (2): f32 and f16 trained here, same recipe
T=/tmp/f16t/tessera
for p in f32 f16; do
  nice $T train --model tiny --steps 141 --batch 64 --lr 5e-4 --warmup 100 --ema 0.999 --seed 2 \
    --precision $p --out /tmp/f16t/tiny-$p-s2.safetensors --data-dir /tmp/bf16t/q/store \
    --loss-log /tmp/f16t/loss-$p-s2.txt --log-every 50 > /tmp/f16t/train-$p-s2.log 2>&1
  echo "train $p rc=$?" >> /tmp/f16t/train-$p-s2.log
done
cd /tmp/bf16t/ev
nice $T eval --local ens-warm-b8 --monolith /tmp/f16t/tiny-f32-s2.safetensors,/tmp/f16t/tiny-f16-s2.safetensors \
  --classifier classifier.safetensors --policies "monolith monolith2" --n 1000 --steps 20 \
  --sampler euler --cfg 2 --precision f32 --json > /tmp/f16t/eval-s2.json 2> /tmp/f16t/eval-s2.log
echo "rc=$?" >> /tmp/f16t/eval-s2.log
