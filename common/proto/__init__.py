"""fedsched's wire protocols: ``decision.proto`` (the agent's gRPC decision service).

``decision_pb2``, ``decision_pb2.pyi`` and ``decision_pb2_grpc`` are generated from
``decision.proto`` by ``scripts/gen_proto.sh``; edit the proto and regenerate, never the
generated files.

May import: nothing from fedsched (the generated modules import protobuf and grpc only).
"""
