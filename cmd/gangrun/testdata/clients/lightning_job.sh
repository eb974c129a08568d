#!/bin/bash
#SBATCH --job-name=lightning --nodes=1 --ntasks-per-node=1 --gres=gpu:1
#SBATCH --time=4 --signal=SIGUSR1@180 --open-mode=append
srun python lightning_train.py
