export { default } from "@engram/eslint-config"
