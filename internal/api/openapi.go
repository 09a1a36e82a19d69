package api

import _ "embed"

// openapiDocument is the OpenAPI 3.1 description of this API, served at
// /v1/openapi.json. TestOpenAPIMatchesRoutes keeps it honest.
//
//go:embed openapi.json
var openapiDocument []byte
