"""Study 08 (``08_kv_dtype_matrix``): every KV dtype the installed vLLM offers. Does it start here, what does it
hold, what does it cost?"""
