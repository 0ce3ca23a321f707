"""A decode layer in two halves, each compiled once for every layer on a GPU: the normed input's q, k and v, then
attention over the cache, the output projection and the MLP."""


def rms(x, weight, eps):
    import torch

    dtype = x.dtype
    x = x.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


def linear(y, w, bias=None):
    """`y` through a weight as the decoder holds it: a tensor (merged, maybe fused); an unmerged linear (weight,
    bias, A, B, scaling), its adapter added as PEFT adds it (in the adapter's dtype, the sum rounded to the base
    layer's); or a tuple of them read apart, their outputs side by side as a fused weight's."""
    import torch
    import torch.nn.functional as F

    if torch.is_tensor(w):
        return F.linear(y, w, bias)
    if isinstance(w[0], tuple):
        return torch.cat([linear(y, part) for part in w], dim=-1)
    weight, own_bias, a, b, scaling = w
    out = F.linear(y, weight, own_bias)
    if a is None:
        return out
    return (out + F.linear(F.linear(y.to(a.dtype), a), b) * scaling).to(out.dtype)


def project(x, input_norm, qkv, qkv_bias, q_norm, k_norm, cos, sin, shape):
    """A decode layer's first half: the normed input's q, k, v for one new token [B, 1, H], rotated."""
    h, kvh, hd, eps = shape
    b = x.shape[0]
    y = linear(rms(x, input_norm, eps), qkv, qkv_bias)
    q, k, v = y.split([h * hd, kvh * hd, kvh * hd], dim=-1)
    q, k = q.view(b, 1, h, hd), k.view(b, 1, kvh, hd)
    if q_norm is not None:
        q, k = rms(q, q_norm, eps), rms(k, k_norm, eps)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.view(b, 1, kvh, hd).transpose(1, 2)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v


def attend(x, q, keys, values, valid, o, o_bias, post_norm, gate_up, down, shape):
    """A decode layer's second half: attention of the new token over the cache slots `valid` marks (each query
    head reads its group's key head, as SDPA's enable_gqa), the output projection, the MLP, the residuals."""
    import torch
    import torch.nn.functional as F

    h, kvh, hd, eps = shape
    b = x.shape[0]
    scores = torch.matmul(q.view(b, kvh, h // kvh, hd), keys.transpose(-1, -2)).to(torch.float32) * hd ** -0.5
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    y = torch.matmul(torch.softmax(scores, dim=-1).to(values.dtype), values)  # [B, kvh, group, hd]
    x = x + linear(y.reshape(b, 1, h * hd), o, o_bias)
    gate, up = linear(rms(x, post_norm, eps), gate_up).chunk(2, dim=-1)
    return x + linear(F.silu(gate) * up, down)


def rotate_half(x):
    import torch

    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

