"""The callify rules (spec §4.2) as equality-saturation rules. Terms: (L op arg), (U op arg x), (B op arg x y),
(R op arg x y z), (V op arg list) with list = (Cons x rest) | (Nil). Facts computed once at insertion:
(fresh c f) f is the fresh storage view minted for c; (view x s) x is one contiguous range of storage, s is that SLICE view;
(storage x) x has buffer identity; (zero x) x has no elements; (candidate x f) x is an intermediate that may be stored
into its fresh buffer view f (only fusion="cost" emits it: egraph/fusion/solve.py). Arg 0 on AFTER/STORE means 'derive dtype from sources'."""
from rules.registry import Rule, register

register(
  # materialize: the all-stored form every realize point can fall back to (spec rules 8, 9)
  Rule("materialize_contiguous", "CONTIGUOUS(x) = AFTER(f, STORE(f, x)) with f a fresh buffer view", "materialize",
       '(= c (U "CONTIGUOUS" a x)) (fresh c f)', '(union c (B "AFTER" 0 f (B "STORE" 0 f x)))', lhs='(U "CONTIGUOUS" a x)'),
  Rule("materialize_assign", "AFTER(t, STORE(t, v)) into a computed t = AFTER(f, STORE(f, v)) with f fresh", "materialize",
       '(= u (B "AFTER" a t (B "STORE" s t2 v))) (computed_arg a) (fresh u f)', '(union u (B "AFTER" 0 f (B "STORE" 0 f v)))',
       lhs='(B "AFTER" a t (B "STORE" s t2 v))'),
  Rule("precompile_call", "GETTUPLE(FUNCTION[precompile], j) = AFTER(out_j, CALL(body writing outs, ins, outs))", "materialize",
       '(= g (U "GETTUPLE" a f)) (precompiled g r)', '(union g r)', lhs='(U "GETTUPLE" a f)'),
  Rule("zero_size", "CONTIGUOUS(x) with no elements = its fresh empty buffer view, nothing to store", "materialize",
       '(= c (U "CONTIGUOUS" a x)) (zero c) (fresh c f)', '(union c f)', lhs='(U "CONTIGUOUS" a x)'),
  # optimize: zero-copy and merge alternatives (spec rules 3, 7, 10, and .contiguous() on storage)
  Rule("contiguous_to_view", "CONTIGUOUS(x) = SLICE view when x is one contiguous range of storage", "optimize",
       '(= c (U "CONTIGUOUS" a x)) (view x s)', '(union c s)', lhs='(U "CONTIGUOUS" a x)'),
  Rule("bitcast_to_view", "BITCAST(x) = retyped SLICE view when x is one contiguous range of storage", "optimize",
       '(= c (U "BITCAST" a x)) (view c s)', '(union c s)', lhs='(U "BITCAST" a x)'),
  Rule("copy_of_view", "COPY(x) = COPY(SLICE view) when x is one contiguous range of storage: only that range is passed",
       "optimize", '(= c (U "COPY" a x)) (view x s)', '(union c (U "COPY" a s))'),
  Rule("contiguous_of_storage", "CONTIGUOUS(x) = x when x already has buffer identity", "materialize",
       '(= c (U "CONTIGUOUS" a x)) (storage x)', '(union c x)', lhs='(U "CONTIGUOUS" a x)'),
  Rule("contiguous_of_assign", "CONTIGUOUS(AFTER(t, w)) = AFTER(t, w) when t has buffer identity", "optimize",
       '(= c (U "CONTIGUOUS" a x)) (= x (B "AFTER" b t w)) (storage t)', '(union c x)', lhs='(U "CONTIGUOUS" a x)'),
  Rule("contiguous_of_assign_n", "CONTIGUOUS(AFTER(t, w...)) = AFTER(t, w...) when t has buffer identity", "optimize",
       '(= c (U "CONTIGUOUS" a x)) (= x (V "AFTER" b (Cons t w))) (storage t)', '(union c x)', lhs='(U "CONTIGUOUS" a x)'),
  Rule("assign_copy_in_place", "AFTER(t, STORE(t, CONTIGUOUS(COPY c))) stores c straight into t, which then holds the copy",
       "optimize", '(= u (B "AFTER" a t (B "STORE" s t k))) (= k (U "CONTIGUOUS" b c)) (copy_into u k)',
       '(union u (B "AFTER" a t (B "STORE" s t c))) (union k u)'),
  Rule("contiguous_idempotent", "CONTIGUOUS(CONTIGUOUS(x)) = CONTIGUOUS(x)", "optimize",
       '(= c (U "CONTIGUOUS" a (U "CONTIGUOUS" b x)))', '(union c (U "CONTIGUOUS" b x))', lhs='(U "CONTIGUOUS" a (U "CONTIGUOUS" b x))'),
  Rule("drop_detach", "DETACH(x) = x", "optimize", '(= d (U "DETACH" a x))', '(union d x)', lhs='(U "DETACH" a x)'),
  Rule("drop_contiguous_backward", "CONTIGUOUS_BACKWARD(x) = x", "optimize", '(= d (U "CONTIGUOUS_BACKWARD" a x))', '(union d x)',
       lhs='(U "CONTIGUOUS_BACKWARD" a x)'),
  Rule("storage_through_reshape", "RESHAPE of storage has buffer identity", "optimize",
       '(= r (U "RESHAPE" a x)) (storage x)', '(storage r)'),
  # fusion (cost mode): the stored form of a candidate intermediate joins its class; extraction of the partition decides
  Rule("store_candidate", "a candidate intermediate x = AFTER(f, STORE(f, x)) with f its fresh buffer view", "optimize",
       '(candidate x f)', '(union x (B "AFTER" 0 f (B "STORE" 0 f x)))'),
)
