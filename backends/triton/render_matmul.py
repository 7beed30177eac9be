def render_matmul(kernel):
    raise NotImplementedError
