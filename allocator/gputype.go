package allocator

import "strings"

// gpuTypeMatches reports whether a device of NVML model name model ("NVIDIA H100 80GB
// HBM3") is of GPU type typ as a user writes it to --gres=gpu:TYPE:N, --gpus=TYPE:N,
// --gpus-per-node TYPE:N or --gpu-model: typ appears in the model name, letter case
// aside and '_' taken for ' '. So Slurm's own names for the model match, the type
// Slurm's AutoDetect=nvml gives the GPU (the NVML name in lower case, each space an
// '_': "nvidia_h100_80gb_hbm3", gpu_common_underscorify_tolower in Slurm's
// src/plugins/gpu/common/gpu_common.c), as do the short names of gres.conf files
// ("h100", "a100", "a100-sxm4-80gb", "tesla_v100").
func gpuTypeMatches(model, typ string) bool {
	norm := func(s string) string { return strings.ReplaceAll(strings.ToLower(s), "_", " ") }
	return strings.Contains(norm(model), norm(typ))
}
