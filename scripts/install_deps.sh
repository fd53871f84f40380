#!/usr/bin/env bash
# Installs the Debian packages trident builds and runs with, if any are missing.
# As root it runs apt-get; as a user it uses sudo when that needs no password,
# and otherwise names the missing packages and exits 1.
set -euo pipefail

packages=(
  g++ make pkg-config
  libopenmpi-dev openmpi-bin        # MPI: mpicxx, mpirun
  libhdf5-dev                       # checkpoints, reference files
  libboost-program-options-dev      # CLI and INI configs
  libdnnl-dev                       # oneDNN: AVX-512 sgemm (ignores OPENBLAS_CORETYPE), bf16 later
  nlohmann-json3-dev                # metrics.jsonl, manifests
  libgtest-dev                      # tests
  zlib1g-dev                        # CRC-32 of checkpoint files, gzip input of prepare
  libssl-dev                        # SHA-256 of tokenizer files (prepare's sidecar)
  fortunes                          # the default training corpus
  libpcre2-dev                      # tokenizers: the gpt2/llama3 pre-tokenizer patterns
  libsentencepiece-dev sentencepiece  # tokenizers: SentencePiece models (spm_encode for the benchmark)
  libfabric-dev                     # doctor: libfabric's providers (efa, FI_HMEM)
  prometheus-cpp-dev                # log.metrics_port: the Prometheus endpoint (its text format)
  prometheus                        # tests: a real Prometheus scrapes a run (and promtool checks it)
  python3-protobuf protobuf-compiler python3-crc32c  # tests: TensorBoard's event files read by protobuf
  libcurl4-openssl-dev libpugixml-dev  # checkpoint.upload: S3 over libcurl (its SigV4), S3's XML answers
  radosgw ceph-mon ceph-osd ceph-common awscli curl  # tests: a real S3 server (Ceph's RADOS Gateway), awscli, curl
  python3 python3-matplotlib        # benchmark sweeps and their plots (benchmarks/sweep.py, plot_sweep.py)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install_deps: installing ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then
  sudo_cmd=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
  sudo_cmd=(sudo -n)
else
  echo "install_deps: missing Debian packages: ${missing[*]}" >&2
  echo "install_deps: run as root: apt-get install -y ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
