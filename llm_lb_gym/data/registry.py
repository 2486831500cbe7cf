"""The named datasets: where each comes from, its license and citation, and its SHA-256.

Every entry's ``path`` is where the file lives under a data directory (``store.py`` searches
``$LLM_LB_GYM_DATA``, or the repository's sibling ``../shared/data`` and then the user cache);
``urls`` are tried in order by ``python -m llm_lb_gym.data fetch NAME``, and whatever arrives
must match ``sha256`` and ``size_bytes``.

Provenance of the checksums. Files present in the developers' ``../shared/data`` were hashed
there, and each was checked byte for byte against the upstream repository at the pinned commit
of its URL (equal Git blob ids), except the two with no public source (``prompts_responses``,
``vidur_a100_llama2_7b_attention_medians``), which cannot be fetched. The Azure code trace and
the Mooncake traces were hashed from the upstream Git objects. The BurstGPT checksums are the
SHA-256 ids of the Git LFS pointers upstream committed for those files (commit 5d93d82); they
were not recomputed from the release assets here, which had no network access.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .._validate import lookup
from .formats import TRACE_FORMATS

KINDS = ("trace", "corpus", "profile")
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Dataset:
    """One file the package can read, and how to get it."""

    name: str
    """Registry key (for a trace also its workload name: ``make_workload(name)``)."""
    path: str
    """Location under a data directory, e.g. ``traces/azure_llm_2023_conv.csv``."""
    sha256: str
    """SHA-256 of the file's bytes (lower-case hex)."""
    size_bytes: int
    """Size of the file in bytes."""
    kind: str
    """"trace" (requests to replay), "corpus" (prompts with responses) or "profile" (GPU)."""
    license: str
    """License of the data (SPDX id where there is one) and who grants it."""
    citation: str
    """What to cite when using it."""
    homepage: str
    """Where the dataset is described ("" when nowhere public)."""
    description: str
    """One line: what is in it."""
    urls: tuple[str, ...] = ()
    """Download sources, tried in order; empty when there is no public download."""
    format: str | None = None
    """Trace format (a key of ``formats.TRACE_FORMATS``); traces only."""
    rows: int | None = None
    """Requests (traces), records (corpus) or table rows (profiles), when known exactly."""
    note: str = ""
    """Provenance caveats, or how to obtain a file that has no public download."""

    def __post_init__(self) -> None:
        if not _SHA256.fullmatch(self.sha256):
            raise ValueError(f"dataset {self.name}: sha256 must be 64 lower-case hex digits")
        if self.kind not in KINDS:
            raise ValueError(f"dataset {self.name}: kind={self.kind!r}; allowed: {', '.join(KINDS)}")
        if (self.kind == "trace") != (self.format is not None):
            raise ValueError(f"dataset {self.name}: a trace needs a format, other kinds none")
        if self.format is not None and self.format not in TRACE_FORMATS:
            raise ValueError(f"dataset {self.name}: format={self.format!r}; "
                             f"allowed: {', '.join(TRACE_FORMATS)}")
        if self.size_bytes <= 0:
            raise ValueError(f"dataset {self.name}: size_bytes must be positive")

    @property
    def downloadable(self) -> bool:
        return bool(self.urls)


_AZURE_2023 = ("https://raw.githubusercontent.com/Azure/AzurePublicDataset/"
               "790921015d50dd6aae7f7e47f39ba0e235ad6b08/data/")
_AZURE_CITATION = ("Pratyush Patel, Esha Choukse, Chaojie Zhang, Aashaka Shah, Íñigo Goiri, Saeed "
                   "Maleki, Ricardo Bianchini. Splitwise: Efficient generative LLM inference using "
                   "phase splitting. ISCA 2024.")
_VIDUR = "https://raw.githubusercontent.com/microsoft/vidur/{commit}/data/{path}"
_VIDUR_CITATION = ("Amey Agrawal, Nitin Kedia, Jayashree Mohan, Ashish Panwar, Nipun Kwatra, "
                   "Bhargav S. Gulavani, Ramachandran Ramjee, Alexey Tumanov. Vidur: A Large-Scale "
                   "Simulation Framework for LLM Inference. MLSys 2024 (arXiv 2405.05465).")
_VIDUR_LICENSE = "MIT (microsoft/vidur)"
_MOONCAKE = ("https://raw.githubusercontent.com/kvcache-ai/Mooncake/"
             "3cca71daccf2a7afb8fe3f0295358f70e3a69fdb/FAST25-release/traces/")
_MOONCAKE_CITATION = ("Ruoyu Qin, Zheming Li, Weiran He, Jialei Cui, Feng Ren, Mingxing Zhang, "
                      "Yongwei Wu, Weimin Zheng, Xinran Xu. Mooncake: Trading More Storage for Less "
                      "Computation - A KVCache-centric Architecture for Serving LLM Chatbot. FAST 2025.")
_MOONCAKE_LICENSE = ("Apache-2.0 (the kvcache-ai/Mooncake repository's license; the trace "
                     "README states no other terms)")
_BURSTGPT = "https://github.com/HPMLL/BurstGPT/releases/download/{tag}/{file}"
_BURSTGPT_LFS = ("https://media.githubusercontent.com/media/HPMLL/BurstGPT/"
                 "5d93d820d9b6bee4e26914df003e5713538164ae/data/{file}")
_BURSTGPT_CITATION = ("Yuxin Wang, Yuhan Chen, Zeyu Li, Xueze Kang, Yuchu Fang, Yeju Zhou, Yang "
                      "Zheng, Zhenheng Tang, Xin He, Rui Guo, Xin Wang, Qiang Wang, Amelie Chi Zhou, "
                      "Xiaowen Chu. BurstGPT: A Real-World Workload Dataset to Optimize LLM Serving "
                      "Systems. KDD 2025 (arXiv 2401.17644).")
_BURSTGPT_NOTE = ("checksum from upstream's Git LFS pointer for data/{file} (commit 5d93d82), "
                  "not recomputed here; about {rows} rows per the BurstGPT README")


def _vidur_profile(name: str, path: str, upstream: str, commit: str, sha256: str, size: int,
                   rows: int, what: str) -> Dataset:
    return Dataset(
        name, path, sha256, size, "profile", _VIDUR_LICENSE, _VIDUR_CITATION,
        "https://github.com/microsoft/vidur", what,
        urls=(_VIDUR.format(commit=commit, path=upstream),), rows=rows)


def _mlp(name: str, gpu: str, model: str, upstream_model: str, commit: str, sha256: str,
         size: int, rows: int) -> Dataset:
    return _vidur_profile(
        name, f"profiling/vidur/compute/{gpu}/{model}/mlp.csv",
        f"profiling/compute/{gpu}/{upstream_model}/mlp.csv", commit, sha256, size, rows,
        f"Vidur per-layer operator times (ms) of {model} on {gpu.upper()} against batch tokens "
        "(vLLM kernels); calibrates the latency presets")


DATASETS: dict[str, Dataset] = {d.name: d for d in (
    # -- request traces (each is also a workload of the same name) -----------------------------
    Dataset("azure_conv", "traces/azure_llm_2023_conv.csv",
            "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8", 719_188, "trace",
            "CC-BY-4.0 (Microsoft Azure, AzurePublicDataset)", _AZURE_CITATION,
            "https://github.com/Azure/AzurePublicDataset/blob/master/AzureLLMInferenceDataset2023.md",
            "Azure LLM inference trace 2023, conversation service: 1 h of arrivals with prompt "
            "and output tokens",
            urls=(_AZURE_2023 + "AzureLLMInferenceTrace_conv.csv",), format="azure", rows=19_366),
    Dataset("azure_code", "traces/azure_llm_2023_code.csv",
            "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6", 320_117, "trace",
            "CC-BY-4.0 (Microsoft Azure, AzurePublicDataset)", _AZURE_CITATION,
            "https://github.com/Azure/AzurePublicDataset/blob/master/AzureLLMInferenceDataset2023.md",
            "Azure LLM inference trace 2023, coding service: 1 h of arrivals with prompt and "
            "output tokens",
            urls=(_AZURE_2023 + "AzureLLMInferenceTrace_code.csv",), format="azure", rows=8_819),
    Dataset("sharegpt", "traces/sharegpt_lengths_llama2_tokenizer.csv",
            "6d6c296302a853e2669a674a96f269283e60c57e60363bd450588a1066919f9f", 949_600, "trace",
            "Apache-2.0 (microsoft/sarathi-serve); lengths only, derived from ShareGPT "
            "conversations, whose own terms are unstated",
            "Amey Agrawal, Nitin Kedia, Ashish Panwar, Jayashree Mohan, Nipun Kwatra, Bhargav S. "
            "Gulavani, Alexey Tumanov, Ramachandran Ramjee. Taming Throughput-Latency Tradeoff in "
            "LLM Inference with Sarathi-Serve. OSDI 2024.",
            "https://github.com/microsoft/sarathi-serve",
            "ShareGPT conversation lengths (prefill and decode tokens, Llama-2 tokenizer, up to "
            "8k); no timestamps",
            urls=("https://raw.githubusercontent.com/microsoft/sarathi-serve/"
                  "72339db5b120614033b317880ad3a05a5e4c9415/data/processed_traces/"
                  "sharegpt_8k_filtered_stats_llama2_tokenizer.csv",),
            format="lengths", rows=30_731,
            note="upstream keeps this file on the niyama_asplos2026 branch; the URL pins its commit"),
    Dataset("arxiv_summarization", "traces/arxiv_summarization_lengths_llama2_tokenizer.csv",
            "9d3580538d915ca75e4aaaa54590b42dbb17abc6d74c8913310cf07c232adcdc", 884_932, "trace",
            "MIT (microsoft/vidur); lengths only, derived from the arXiv summarization dataset",
            _VIDUR_CITATION + " Arman Cohan et al. A Discourse-Aware Attention Model for "
            "Abstractive Summarization of Long Documents. NAACL 2018.",
            "https://github.com/microsoft/vidur",
            "arXiv summarization lengths (long prompts, short outputs; Llama-2 tokenizer); no "
            "timestamps",
            urls=(_VIDUR.format(commit="6d98aa8f71696520acc603d87439e77cc78160a7",
                                path="processed_traces/"
                                     "arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"),),
            format="lengths", rows=28_257),
    Dataset("mooncake_conversation", "traces/mooncake_conversation_trace.jsonl",
            "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df", 3_029_533, "trace",
            _MOONCAKE_LICENSE, _MOONCAKE_CITATION,
            "https://github.com/kvcache-ai/Mooncake/tree/main/FAST25-release",
            "Mooncake (Kimi) conversation workload, FAST'25 release: 1 h of arrivals (ms), long "
            "prompts (mean 12k tokens), prefix block hashes",
            urls=(_MOONCAKE + "conversation_trace.jsonl",), format="mooncake", rows=12_031),
    Dataset("mooncake_synthetic", "traces/mooncake_synthetic_trace.jsonl",
            "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131", 1_136_313, "trace",
            _MOONCAKE_LICENSE, _MOONCAKE_CITATION,
            "https://github.com/kvcache-ai/Mooncake/tree/main/FAST25-release",
            "Mooncake synthetic workload, FAST'25 release: public-dataset requests with Poisson "
            "arrivals (ms)",
            urls=(_MOONCAKE + "synthetic_trace.jsonl",), format="mooncake", rows=3_993),
    Dataset("burstgpt_1", "traces/burstgpt_1.csv",
            "4bb3783693d0a435686fbfc885615d2349bd067239079fa4b749f2e679e12122", 52_283_111, "trace",
            "CC-BY-4.0 (HPMLL/BurstGPT)", _BURSTGPT_CITATION, "https://github.com/HPMLL/BurstGPT",
            "BurstGPT, first 2 months of ChatGPT and GPT-4 calls via Azure: arrivals (s), model, "
            "request and response tokens; failed requests have 0 response tokens (dropped)",
            urls=(_BURSTGPT.format(tag="v2.0", file="BurstGPT_1.csv"),
                  _BURSTGPT.format(tag="v1.1", file="BurstGPT_1.csv"),
                  _BURSTGPT_LFS.format(file="BurstGPT_1.csv")),
            format="burstgpt", note=_BURSTGPT_NOTE.format(file="BurstGPT_1.csv", rows="1,429.7k")),
    Dataset("burstgpt_without_fails_1", "traces/burstgpt_without_fails_1.csv",
            "a4d068a7113ec0290e74063a1b3447dc6001a30e4298eb313581b71006dda1f4", 51_429_517, "trace",
            "CC-BY-4.0 (HPMLL/BurstGPT)", _BURSTGPT_CITATION, "https://github.com/HPMLL/BurstGPT",
            "BurstGPT, first 2 months, failed requests removed",
            urls=(_BURSTGPT.format(tag="v2.0", file="BurstGPT_without_fails_1.csv"),
                  _BURSTGPT.format(tag="v1.1", file="BurstGPT_without_fails_1.csv"),
                  _BURSTGPT_LFS.format(file="BurstGPT_without_fails_1.csv")),
            format="burstgpt",
            note=_BURSTGPT_NOTE.format(file="BurstGPT_without_fails_1.csv", rows="1,404.3k")),
    # -- prompts with responses (the predictors' corpus) ---------------------------------------
    Dataset("prompts_responses", "text/prompts_responses.jsonl.gz",
            "05add9c1cdb4dabe115f91b76ba98c36edf1bc862121bd4ecaa0010ebcec6a76", 6_559_271, "corpus",
            "mixed, per source: AlpacaEval outputs CC-BY-NC-4.0 (research use), MT-bench "
            "CC-BY-4.0 / Apache-2.0, Self-Instruct and P3 Apache-2.0, GSM8K and HumanEval MIT, "
            "WMT23 translations and news summarization per their releases",
            "Cite the sources above (AlpacaEval, MT-bench, Self-Instruct, P3/T0, GSM8K, WMT23, "
            "HumanEval) for the prompts and responses you use.",
            "",
            "20,254 prompts with real LLM responses and WordPiece token counts, 11 task types",
            format=None, rows=20_254,
            note="assembled by this project's developers from the public sources above; no public "
                 "download of the assembled file exists yet, so copy it from a developer's "
                 "../shared/data/text/ or pass path= to a JSONL corpus of your own"),
    # -- GPU profiles (llm_lb_gym.calibration) -------------------------------------------------
    _mlp("vidur_a100_llama2_7b_mlp", "a100", "Llama-2-7b-hf", "meta-llama/Llama-2-7b-hf",
         "bee57dafa1eb2dc422dcaec46a66975599a6a242",
         "2cfacca979f32e83257753cf6fd815a71af8ba9a7a9d0643b18d9f54e8a37688", 706_614, 1_044),
    _mlp("vidur_a100_llama3_8b_mlp", "a100", "Meta-Llama-3-8B", "meta-llama/Meta-Llama-3-8B",
         "2bb7a086c74cd4639e86ff74ab07cd1fa0f9a97f",
         "98c26488298e324e89db7349e213f75c856ae83dc6b17548a68636d2cb5efff0", 1_204_856, 1_824),
    _mlp("vidur_h100_llama2_7b_mlp", "h100", "Llama-2-7b-hf", "meta-llama/Llama-2-7b-hf",
         "e26eb8f79fa9a6a7c38eac0f5291302402b20364",
         "b1a2def08857d10e5f66c3b5b2d046b6e8caed5c30b2bc920a0462598e3b2a59", 715_469, 1_044),
    _mlp("vidur_a40_llama2_7b_mlp", "a40", "Llama-2-7b-hf", "meta-llama/Llama-2-7b-hf",
         "e26eb8f79fa9a6a7c38eac0f5291302402b20364",
         "f8d0f455d0b72b7975be0ed8e1951dcbf2eabc083001b27f6ef8203c0a96962c", 689_225, 1_044),
    _vidur_profile(
        "vidur_a100_cpu_overheads", "profiling/vidur/cpu_overheads_a100.csv",
        "profiling/a100/cpu_overheads.csv", "6d98aa8f71696520acc603d87439e77cc78160a7",
        "79694db647120090f96192625c70d74dc79bd3c7e0bfcb053726413e2a25c548", 27_946, 78,
        "Vidur per-iteration CPU overheads (schedule, sampler, prepare inputs, process outputs) "
        "on A100 by model, batch size and tensor parallel degree"),
    Dataset("vidur_a100_llama2_7b_attention_medians",
            "profiling/vidur/attention_medians_llama2_7b_a100.txt",
            "32d142353d42c50c4752029cac9fd92639ef9ce5940edba54dcb472a7636351b", 1_441, "profile",
            _VIDUR_LICENSE, _VIDUR_CITATION, "https://github.com/microsoft/vidur",
            "per-layer attention medians (ms) of Llama-2-7B on A100 (TP1, FlashAttention): "
            "decode by batch and context, prefill by chunk and cached tokens",
            note="transcribed by this project's developers from Vidur's data/profiling/compute/"
                 "a100/meta-llama/Llama-2-7b-hf/attention.csv (10.7 MB, MIT); no download of the "
                 "transcription exists, so copy it from a developer's ../shared/data/profiling/ "
                 "(only python -m llm_lb_gym.experiments.calibrate reads it; the fitted presets ship with "
                 "the package)"),
)}
"""Every named dataset; ``python -m llm_lb_gym.data list`` prints them."""


def get_dataset(name: str) -> Dataset:
    """The dataset ``name``; an unknown name raises ConfigError listing the valid ones."""
    return lookup("dataset", DATASETS, name)


def trace_datasets() -> dict[str, Dataset]:
    """The request traces, by name (each is a workload of the same name)."""
    return {n: d for n, d in DATASETS.items() if d.kind == "trace"}
