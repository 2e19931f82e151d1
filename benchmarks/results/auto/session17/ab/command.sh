#!/bin/bash
# alternate new (2eefa3d) / old (0cdb75c) whole-world runs, batch 1 and 8
out=/work/scratch/s17/ab
mkdir -p $out
for i in 1 2 3 4 5; do  # pairs 4 and 5 ran later, after the CI
  for v in new old; do
    root=/work/scratch/s17/$v
    (cd $root && PYTHONPATH=$root /work/main/.venv/bin/python benchmarks/auto_world.py --batch-sizes 1 8 --prompts 8 --repeats 5 --out $out/$v-$i) > $out/$v-$i.log 2>&1
  done
done
echo done > $out/DONE
