"""/metrics bodies as vLLM writes them, shared by the tests that parse them
(tests/serving/test_lora_metrics.py) and serve them (tests/observability)."""

VLLM_032 = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-llama"} 1.0
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.7645e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="legal-contracts,hr-policy",waiting_lora_adapters="finance-risk"} 1.7646e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="legal-contracts",waiting_lora_adapters=""} 1.7644e+09
"""  # noqa: E501 - the lines as vLLM writes them
