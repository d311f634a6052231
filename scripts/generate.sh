#!/usr/bin/env bash
# Regenerates schemas/gen and the OpenAPI document from schemas/proto with
# pinned tool versions. Generated code is committed; run after editing a .proto.
set -euo pipefail
cd "$(dirname "$0")/.."

PROTOC_GEN_GO=v1.36.12
PROTOC_GEN_GO_GRPC=v1.6.0
GRPC_GATEWAY=v2.33.0
VTPROTO=v0.6.1-0.20240319094008-0393e58bdf10
PROTOC_WANT="libprotoc 3.21.12"   # Debian 12's protobuf-compiler

if ! command -v protoc >/dev/null; then
  echo "generate: installing protobuf-compiler (apt)" >&2
  ${SUDO:-$( [ "$(id -u)" = 0 ] || echo sudo )} apt-get install -y protobuf-compiler >/dev/null
fi
[ "$(protoc --version)" = "$PROTOC_WANT" ] || echo "generate: warning: $(protoc --version), pinned $PROTOC_WANT" >&2

bin=$PWD/.cache/bin
mkdir -p "$bin"
install_tool() { # name module@version
  local stamp="$bin/.$1.$(echo "$2" | tr '/@' '__')"
  [ -x "$bin/$1" ] && [ -f "$stamp" ] && return
  GOBIN=$bin go install "$2" && touch "$stamp"
}
install_tool protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO
install_tool protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC
install_tool protoc-gen-grpc-gateway github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-grpc-gateway@$GRPC_GATEWAY
install_tool protoc-gen-openapiv2 github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-openapiv2@$GRPC_GATEWAY
install_tool protoc-gen-go-vtproto github.com/planetscale/vtprotobuf/cmd/protoc-gen-go-vtproto@$VTPROTO

out=schemas/gen
rm -rf "$out" && mkdir -p "$out"
protos="datamodels/health_event.proto datamodels/external_remediation.proto faultline/v1/faultline.proto"
api=schemas/proto/faultline/v1/http.yaml
PATH=$bin:$PATH protoc -I schemas/proto \
  --go_out="$out" --go_opt=paths=source_relative \
  --go-grpc_out="$out" --go-grpc_opt=paths=source_relative \
  --go-vtproto_out="$out" --go-vtproto_opt=paths=source_relative,features=marshal+unmarshal+size \
  --grpc-gateway_out="$out" --grpc-gateway_opt=paths=source_relative,grpc_api_configuration=$api \
  --openapiv2_out="$out" --openapiv2_opt=grpc_api_configuration=$api,allow_merge=true,merge_file_name=faultline,json_names_for_fields=true \
  $protos
mv "$out/faultline.swagger.json" gateway/openapi/openapi.json
echo "generate: wrote $out and gateway/openapi/openapi.json"
