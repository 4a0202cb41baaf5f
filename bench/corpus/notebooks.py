"""Six notebooks in the shape of the public tutorials CPU users run, as lists of cells.

Each follows the structure of a well-known public notebook (karpathy's makemore parts 1-4,
the PyTorch quickstart, the per-sample-gradients tutorial): the same kinds of loops over
small tensor ops, hand-written updates and torch.func transforms, on synthetic data so the
benchmark runs offline. Sizes keep each plain run at a few seconds on one CPU core.
"""

from __future__ import annotations

NAMES = """\
import random
import torch
import torch.nn.functional as F
rng = random.Random(42)
words = ["".join(rng.choice("bcdfghjklmnpqrstvwxz" if i % 2 else "aeiouy")
                 for i in range(rng.randint(3, 9))) for _ in range(8000)]
chars = sorted(set("".join(words)))
stoi = {s: i + 1 for i, s in enumerate(chars)}
stoi["."] = 0
itos = {i: s for s, i in stoi.items()}
vocab_size = len(itos)
"""

DATASET = """\
block_size = 3
def build_dataset(words):
    X, Y = [], []
    for w in words:
        context = [0] * block_size
        for ch in w + ".":
            ix = stoi[ch]
            X.append(context)
            Y.append(ix)
            context = context[1:] + [ix]
    return torch.tensor(X), torch.tensor(Y)
n1 = int(0.9 * len(words))
Xtr, Ytr = build_dataset(words[:n1])
Xdev, Ydev = build_dataset(words[n1:])
"""

BIGRAMS = [
    NAMES,
    """\
N = torch.zeros((vocab_size, vocab_size), dtype=torch.int32)
for w in words:
    chs = ["."] + list(w) + ["."]
    for ch1, ch2 in zip(chs, chs[1:]):
        N[stoi[ch1], stoi[ch2]] += 1
""",
    """\
P = (N + 1).float()
P /= P.sum(1, keepdim=True)
g = torch.Generator().manual_seed(2147483647)
out = []
for i in range(200):
    ix = 0
    name = []
    while True:
        ix = torch.multinomial(P[ix], num_samples=1, replacement=True, generator=g).item()
        if ix == 0:
            break
        name.append(itos[ix])
    out.append("".join(name))
""",
    """\
xs, ys = [], []
for w in words:
    chs = ["."] + list(w) + ["."]
    for ch1, ch2 in zip(chs, chs[1:]):
        xs.append(stoi[ch1])
        ys.append(stoi[ch2])
xs, ys = torch.tensor(xs), torch.tensor(ys)
W = torch.randn((vocab_size, vocab_size), generator=g, requires_grad=True)
""",
    """\
for k in range(300):
    xenc = F.one_hot(xs, num_classes=vocab_size).float()
    logits = xenc @ W
    counts = logits.exp()
    probs = counts / counts.sum(1, keepdims=True)
    loss = -probs[torch.arange(len(ys)), ys].log().mean() + 0.01 * (W**2).mean()
    W.grad = None
    loss.backward()
    W.data += -50 * W.grad
""",
]

MLP = [
    NAMES,
    DATASET,
    """\
g = torch.Generator().manual_seed(2147483647)
C = torch.randn((vocab_size, 10), generator=g)
W1 = torch.randn((30, 200), generator=g)
b1 = torch.randn(200, generator=g)
W2 = torch.randn((200, vocab_size), generator=g)
b2 = torch.randn(vocab_size, generator=g)
parameters = [C, W1, b1, W2, b2]
for p in parameters:
    p.requires_grad = True
lossi = []
""",
    """\
for i in range(20000):
    ix = torch.randint(0, Xtr.shape[0], (32,))
    emb = C[Xtr[ix]]
    h = torch.tanh(emb.view(-1, 30) @ W1 + b1)
    logits = h @ W2 + b2
    loss = F.cross_entropy(logits, Ytr[ix])
    for p in parameters:
        p.grad = None
    loss.backward()
    lr = 0.1 if i < 15000 else 0.01
    for p in parameters:
        p.data += -lr * p.grad
    lossi.append(loss.log10().item())
""",
    """\
with torch.no_grad():
    emb = C[Xdev]
    h = torch.tanh(emb.view(-1, 30) @ W1 + b1)
    dev_loss = F.cross_entropy(h @ W2 + b2, Ydev).item()
""",
]

LAYERS = [
    NAMES,
    DATASET,
    """\
class Linear:
    def __init__(self, fan_in, fan_out, bias=True):
        self.weight = torch.randn((fan_in, fan_out), generator=g) / fan_in**0.5
        self.bias = torch.zeros(fan_out) if bias else None
    def __call__(self, x):
        self.out = x @ self.weight
        if self.bias is not None:
            self.out += self.bias
        return self.out
    def parameters(self):
        return [self.weight] + ([] if self.bias is None else [self.bias])

class BatchNorm1d:
    def __init__(self, dim, eps=1e-5, momentum=0.1):
        self.eps, self.momentum, self.training = eps, momentum, True
        self.gamma, self.beta = torch.ones(dim), torch.zeros(dim)
        self.running_mean, self.running_var = torch.zeros(dim), torch.ones(dim)
    def __call__(self, x):
        if self.training:
            xmean, xvar = x.mean(0, keepdim=True), x.var(0, keepdim=True)
        else:
            xmean, xvar = self.running_mean, self.running_var
        self.out = self.gamma * (x - xmean) / torch.sqrt(xvar + self.eps) + self.beta
        if self.training:
            with torch.no_grad():
                self.running_mean = (1 - self.momentum) * self.running_mean + self.momentum * xmean
                self.running_var = (1 - self.momentum) * self.running_var + self.momentum * xvar
        return self.out
    def parameters(self):
        return [self.gamma, self.beta]

class Tanh:
    def __call__(self, x):
        self.out = torch.tanh(x)
        return self.out
    def parameters(self):
        return []
""",
    """\
g = torch.Generator().manual_seed(2147483647)
n_embd, n_hidden = 10, 100
C = torch.randn((vocab_size, n_embd), generator=g)
layers = [Linear(n_embd * block_size, n_hidden, bias=False), BatchNorm1d(n_hidden), Tanh()]
for _ in range(4):
    layers += [Linear(n_hidden, n_hidden, bias=False), BatchNorm1d(n_hidden), Tanh()]
layers += [Linear(n_hidden, vocab_size, bias=False), BatchNorm1d(vocab_size)]
with torch.no_grad():
    layers[-1].gamma *= 0.1
parameters = [C] + [p for layer in layers for p in layer.parameters()]
for p in parameters:
    p.requires_grad = True
lossi, ud = [], []
""",
    """\
for i in range(3000):
    ix = torch.randint(0, Xtr.shape[0], (32,), generator=g)
    x = C[Xtr[ix]].view(32, -1)
    for layer in layers:
        x = layer(x)
    loss = F.cross_entropy(x, Ytr[ix])
    for layer in layers:
        layer.out.retain_grad()
    for p in parameters:
        p.grad = None
    loss.backward()
    lr = 0.1
    for p in parameters:
        p.data += -lr * p.grad
    lossi.append(loss.log10().item())
    with torch.no_grad():
        ud.append([((lr * p.grad).std() / p.data.std()).log10().item() for p in parameters])
""",
]

BACKPROP = [
    NAMES,
    DATASET,
    """\
g = torch.Generator().manual_seed(2147483647)
n_embd, n_hidden, batch_size = 10, 64, 32
C = torch.randn((vocab_size, n_embd), generator=g)
W1 = torch.randn((n_embd * block_size, n_hidden), generator=g) * (5 / 3) / (n_embd * block_size) ** 0.5
b1 = torch.randn(n_hidden, generator=g) * 0.1
W2 = torch.randn((n_hidden, vocab_size), generator=g) * 0.1
b2 = torch.randn(vocab_size, generator=g) * 0.1
bngain = torch.randn((1, n_hidden)) * 0.1 + 1.0
bnbias = torch.randn((1, n_hidden)) * 0.1
parameters = [C, W1, b1, W2, b2, bngain, bnbias]
for p in parameters:
    p.requires_grad = True
def cmp(s, dt, t):
    return torch.allclose(dt, t.grad)
""",
    """\
with torch.no_grad():
    for i in range(3000):
        ix = torch.randint(0, Xtr.shape[0], (batch_size,), generator=g)
        Xb, Yb = Xtr[ix], Ytr[ix]
        emb = C[Xb]
        embcat = emb.view(emb.shape[0], -1)
        hprebn = embcat @ W1 + b1
        bnmean = hprebn.mean(0, keepdim=True)
        bnvar = hprebn.var(0, keepdim=True, unbiased=True)
        bnvar_inv = (bnvar + 1e-5) ** -0.5
        bnraw = (hprebn - bnmean) * bnvar_inv
        hpreact = bngain * bnraw + bnbias
        h = torch.tanh(hpreact)
        logits = h @ W2 + b2
        loss = F.cross_entropy(logits, Yb)
        dlogits = F.softmax(logits, 1)
        dlogits[range(batch_size), Yb] -= 1
        dlogits /= batch_size
        dh = dlogits @ W2.T
        dW2 = h.T @ dlogits
        db2 = dlogits.sum(0)
        dhpreact = (1.0 - h**2) * dh
        dbngain = (bnraw * dhpreact).sum(0, keepdim=True)
        dbnbias = dhpreact.sum(0, keepdim=True)
        dhprebn = bngain * bnvar_inv / batch_size * (
            batch_size * dhpreact - dhpreact.sum(0) - batch_size / (batch_size - 1) * bnraw * (dhpreact * bnraw).sum(0))
        dembcat = dhprebn @ W1.T
        dW1 = embcat.T @ dhprebn
        db1 = dhprebn.sum(0)
        demb = dembcat.view(emb.shape)
        dC = torch.zeros_like(C)
        for k in range(Xb.shape[0]):
            for j in range(Xb.shape[1]):
                dC[Xb[k, j]] += demb[k, j]
        grads = [dC, dW1, db1, dW2, db2, dbngain, dbnbias]
        lr = 0.1 if i < 2000 else 0.01
        for p, grad in zip(parameters, grads):
            p.data += -lr * grad
""",
]

QUICKSTART = [
    """\
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
images = torch.rand(6000, 1, 28, 28)
labels = torch.randint(0, 10, (6000,))
train_dataloader = DataLoader(TensorDataset(images[:5000], labels[:5000]), batch_size=64)
test_dataloader = DataLoader(TensorDataset(images[5000:], labels[5000:]), batch_size=64)
""",
    """\
class NeuralNetwork(nn.Module):
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.linear_relu_stack = nn.Sequential(
            nn.Linear(28 * 28, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    def forward(self, x):
        return self.linear_relu_stack(self.flatten(x))
model = NeuralNetwork()
loss_fn = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
""",
    """\
def train(dataloader, model, loss_fn, optimizer):
    model.train()
    for batch, (X, y) in enumerate(dataloader):
        loss = loss_fn(model(X), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

def test(dataloader, model, loss_fn):
    model.eval()
    test_loss, correct = 0, 0
    with torch.no_grad():
        for X, y in dataloader:
            pred = model(X)
            test_loss += loss_fn(pred, y).item()
            correct += (pred.argmax(1) == y).type(torch.float).sum().item()
    return test_loss / len(dataloader), correct / len(dataloader.dataset)
""",
    """\
for t in range(5):
    train(train_dataloader, model, loss_fn, optimizer)
    result = test(test_dataloader, model, loss_fn)
""",
]

PER_SAMPLE = [
    """\
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap
torch.manual_seed(0)
class SimpleCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)
    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return F.log_softmax(self.fc2(x), dim=1)
model = SimpleCNN()
batch_size = 32
data = torch.randn(batch_size, 1, 28, 28)
targets = torch.randint(10, (batch_size,))
""",
    """\
def compute_grad(sample, target):
    sample, target = sample.unsqueeze(0), target.unsqueeze(0)
    loss = F.nll_loss(model(sample), target)
    return torch.autograd.grad(loss, list(model.parameters()))
per_sample_grads = [compute_grad(data[i], targets[i]) for i in range(batch_size)]
per_sample_grads = list(zip(*per_sample_grads))
per_sample_grads = [torch.stack(shards) for shards in per_sample_grads]
""",
    """\
params = {k: v.detach() for k, v in model.named_parameters()}
buffers = {k: v.detach() for k, v in model.named_buffers()}
def compute_loss(params, buffers, sample, target):
    predictions = functional_call(model, (params, buffers), (sample.unsqueeze(0),))
    return F.nll_loss(predictions, target.unsqueeze(0))
ft_compute_sample_grad = vmap(grad(compute_loss), in_dims=(None, None, 0, 0))
for _ in range(5):
    ft_per_sample_grads = ft_compute_sample_grad(params, buffers, data, targets)
""",
    """\
for per_sample_grad, ft_per_sample_grad in zip(per_sample_grads, ft_per_sample_grads.values()):
    assert torch.allclose(per_sample_grad, ft_per_sample_grad, atol=3e-3, rtol=1e-5)
""",
]

NOTEBOOKS: dict[str, list[str]] = {
    "makemore-bigrams": BIGRAMS,
    "makemore-mlp": MLP,
    "makemore-batchnorm": LAYERS,
    "makemore-backprop": BACKPROP,
    "pytorch-quickstart": QUICKSTART,
    "per-sample-grads": PER_SAMPLE,
}
