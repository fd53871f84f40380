# Environment for NCCL over AWS EFA with GPUDirect RDMA (p4d/p5), through libfabric and
# the aws-ofi-nccl plugin. Sourced by the launchers; harmless on machines without EFA.
# (`trident doctor` checks a rank's environment against the `export` lines of the `if`.)
if command -v fi_info >/dev/null 2>&1 && fi_info -p efa >/dev/null 2>&1; then
  export FI_PROVIDER=efa
  export FI_EFA_USE_DEVICE_RDMA=1     # GPUDirect RDMA
  export FI_EFA_FORK_SAFE=1
  export NCCL_PROTO=simple            # what aws-ofi-nccl recommends on EFA
  export NCCL_SOCKET_IFNAME=^lo,docker
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

# Every variable this file sets. srun hands the ranks the whole environment; mpirun only
# the variables named with -x, which the launchers take from here (train.sbatch's mpirun
# branch, mpirun_ec2.sh): a variable added above is added here, and reaches every rank.
# tests/slurm/test_efa_env.sh runs the launchers and checks that each forwards exactly these.
efa_env_names="FI_PROVIDER FI_EFA_USE_DEVICE_RDMA FI_EFA_FORK_SAFE NCCL_PROTO NCCL_SOCKET_IFNAME OMP_NUM_THREADS"

# mpirun's arguments that forward them: "-x NAME" for each one set (mpirun warns about
# one that is not), one word a line, for `mapfile -t flags < <(efa_env_mpirun_flags)`.
efa_env_mpirun_flags() {
  local name
  for name in $efa_env_names; do
    if printenv "$name" >/dev/null; then printf -- '-x\n%s\n' "$name"; fi
  done
}
