"""platform: slurm — trials on HPC clusters through sbatch / squeue / scancel (backend.py), its
config fields (config.py)."""
