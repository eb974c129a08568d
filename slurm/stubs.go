package slurm

const sbatchHelp = "Usage: sbatch [OPTIONS...] executable [args...]\n"
const srunHelp = "Usage: srun [OPTIONS...] executable [args...]\n"
