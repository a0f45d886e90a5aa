"""Telling an inference backend to serve new weights: one small protocol (`base.py`), a module
for each kind, and `detection.py`, which picks one.

- `triad` (`triad.py`): triad's `/admin/weights` routes on its vLLM server (versions checked
            against the step's `DONE` marker, in-flight requests kept);
- `triad-lora` (`lora.py`): a LoRA run (`trainer.lora.rank > 0`) on triad's server: each
            version's adapter loaded with `POST /admin/adapters` beside other runs' adapters, and
            requests addressed to `<adapter_name>@v<V>` (version 0: the base model);
- `vllm` (`stock_vllm.py`): a stock `vllm serve` with its RL routes (`VLLM_SERVER_DEV_MODE=1`):
            pause, start, update, finish, resume, through triad's `triad_disk` weight-transfer
            engine (`inference/vllm_engine.py`); the version is the `weight_version` vLLM
            reports, and `/weight_checker` checksums catch a parameter the reload skipped.
            Those routes have no authentication: loopback servers only;
- `sglang` (`sglang.py`): SGLang's native `POST /update_weights_from_disk`;
- `none` (`frozen.py`): any other OpenAI-compatible server; the policy stays frozen.

`detection.detect` picks the kind by asking the server, unless config names one;
`detection.backend_for` picks `triad-lora` for a LoRA run.
"""
