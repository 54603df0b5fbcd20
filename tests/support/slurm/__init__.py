"""A real Slurm cluster on loopback (fixtures) and experiment drivers for the Slurm tests."""
