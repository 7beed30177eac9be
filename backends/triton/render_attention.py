def render_attention(kernel):
    raise NotImplementedError
