// The protobuf/gRPC stub generator of the fedsched Score plugin: a module of its own, so the
// plugin's module does not depend on the compiler. See ../../README.md ("Regenerating the stubs").
module fedsched.dev/scoreplugin/hack/genproto

go 1.26.0

tool (
	google.golang.org/grpc/cmd/protoc-gen-go-grpc
	google.golang.org/protobuf/cmd/protoc-gen-go
)

require (
	github.com/bufbuild/protocompile v0.14.1
	google.golang.org/protobuf v1.36.11
)

require (
	golang.org/x/sync v0.8.0 // indirect
	google.golang.org/grpc/cmd/protoc-gen-go-grpc v1.6.2 // indirect
)
