# Sourced by every kit script. KIT_ROOT: where everything lives on the GPU machine (/tmp persists while the
# machine is warm; the carried tree does not). The CPU rehearsal sets KIT_ROOT elsewhere.
R=${KIT_ROOT:-/tmp}
KIT_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)   # the carried kit (or $R/kit once installed)
export KIT_ROOT=$R
export PATH=$R/bin:$PATH
KPP=$R/proj:$R/site; [ "${KIT_NO_SITE:-0}" = 1 ] && KPP=$R/proj   # rehearsal: $R/site holds cp312 builds
export PYTHONPATH=$KPP${PYTHONPATH:+:$PYTHONPATH}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export PYTHONUNBUFFERED=1
mkdir -p $R/out
