#!/bin/bash
# alternate old (9801393) / new (e20eb19) whole-world runs, batch 1 and 8
out=/work/scratch/s16/ab1
mkdir -p $out
for i in 1 2 3; do
  for v in new old; do
    root=/work/scratch/s16/$v
    (cd $root && PYTHONPATH=$root /work/main/.venv/bin/python benchmarks/auto_world.py --batch-sizes 1 8 --prompts 8 --repeats 5 --out $out/$v-$i) > $out/$v-$i.log 2>&1
  done
done
