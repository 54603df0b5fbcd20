"""SSH shared by backends that reach machines over SSH (remote's workers, Slurm's login node):
machine specs (machine.py), connecting with host-key checks (connection.py), commands and SFTP
(commands.py), remote port forwards (tunnel.py). Backends never import each other; they share this."""
