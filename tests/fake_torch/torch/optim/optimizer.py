"""FAKE torch.optim.optimizer — a test double (see tests/fake_torch/README.md): step pre and post
hooks, per optimizer and global, with PyTorch 2.x's signatures and order (global pre hooks, the
optimizer's pre hooks, the step, the optimizer's post hooks, global post hooks)."""
import itertools

_global_optimizer_pre_hooks = {}
_global_optimizer_post_hooks = {}
_ids = itertools.count()


class _Handle:
    def __init__(self, table, key):
        self._table, self._key = table, key

    def remove(self):
        self._table.pop(self._key, None)


def _register(table, hook):
    key = next(_ids)
    table[key] = hook
    return _Handle(table, key)


def register_optimizer_step_pre_hook(hook):
    return _register(_global_optimizer_pre_hooks, hook)


def register_optimizer_step_post_hook(hook):
    return _register(_global_optimizer_post_hooks, hook)


class Optimizer:
    def __init__(self):
        self._optimizer_step_pre_hooks = {}
        self._optimizer_step_post_hooks = {}
        self.steps = 0

    def register_step_pre_hook(self, hook):
        return _register(self._optimizer_step_pre_hooks, hook)

    def register_step_post_hook(self, hook):
        return _register(self._optimizer_step_post_hooks, hook)

    def step(self, *args, **kwargs):
        for hook in itertools.chain(list(_global_optimizer_pre_hooks.values()),
                                    list(self._optimizer_step_pre_hooks.values())):
            hook(self, args, kwargs)
        self.steps += 1
        for hook in itertools.chain(list(self._optimizer_step_post_hooks.values()),
                                    list(_global_optimizer_post_hooks.values())):
            hook(self, args, kwargs)


class AdamW(Optimizer):
    pass
